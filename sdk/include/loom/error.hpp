// loom's one error family.
//
// Every failure that reaches the user is a loom::Error: a message, plus a chain of context added
// on the way out ("while loading configs/x.yaml", "while creating optimizer 'adamw'"). The `loom`
// command prints it once and exits 2 for a UserError (bad config, missing file, unknown name:
// something the user can fix) and 1 for an InternalError (a bug in loom or a plugin).
//
// Plugins throw these from component constructors and methods; the core adds context. Never
// abort() on bad input.
#pragma once

#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

enum class ErrorKind { user, internal };

// The destructors are defined in libloom_core.so, which makes them the classes' key functions:
// their vtables and type information live in the core, not in each plugin that throws them, so
// an exception thrown by a plugin never refers to the plugin's code once it is caught.
class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message);
  ~Error() override;

  ErrorKind kind() const noexcept { return kind_; }
  // The innermost message, without context.
  const std::string& message() const noexcept { return message_; }
  // Context, outermost first.
  const std::vector<std::string>& context() const noexcept { return context_; }
  // Adds an outer layer of context ("while creating model 'gpt2'").
  void add_context(std::string context);
  // "while a: while b: message": what() returns the same text.
  const char* what() const noexcept override { return full_.c_str(); }

 private:
  void rebuild();
  ErrorKind kind_;
  std::string message_;
  std::vector<std::string> context_;
  std::string full_;
};

// Something the user can fix: the config, the command line, a file on disk.
class UserError : public Error {
 public:
  explicit UserError(std::string message) : Error(ErrorKind::user, std::move(message)) {}
  ~UserError() override;
};

// A device that this machine lacks or cannot use: a backend or attention kernel for a GPU
// created where there is none, no driver, or not the runtime libraries it needs. A UserError
// (the config asks for hardware the machine does not have: `loom` exits 2), of its own type so
// that a test suite can tell "cannot run here" from a failure: the conformance suites skip a
// component whose creation throws it.
class DeviceUnavailable : public UserError {
 public:
  explicit DeviceUnavailable(std::string message) : UserError(std::move(message)) {}
  ~DeviceUnavailable() override;
};

// A bug: a broken invariant in loom or in a plugin.
class InternalError : public Error {
 public:
  explicit InternalError(std::string message) : Error(ErrorKind::internal, std::move(message)) {}
  ~InternalError() override;
};

// For a catch (...) block: "an exception that is not a std::exception (of type int)", the type
// demangled; what a message can say about an exception that carries no what().
std::string describe_current_exception();

// Runs `body`; a loom::Error escaping it gets `context` added, and any other exception (a
// std::exception or not) becomes an InternalError with that context, so that the message names
// the component or file it came from. Use at layer boundaries, not in hot loops.
template <class F>
decltype(auto) with_context(std::string_view context, F&& body) {
  try {
    return std::forward<F>(body)();
  } catch (Error& e) {
    e.add_context(std::string(context));
    throw;
  } catch (const std::exception& e) {
    InternalError wrapped(e.what());
    wrapped.add_context(std::string(context));
    throw wrapped;
  } catch (...) {
    InternalError wrapped(describe_current_exception());
    wrapped.add_context(std::string(context));
    throw wrapped;
  }
}

// The closest candidate to `word` by edit distance, or "" when none is close enough to be a
// plausible typo. Used for every "did you mean" in loom's messages.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// `input` (bytes read from a file, or given by the user) made safe to quote in a message:
// control characters, DEL and bytes that are not valid UTF-8 escaped (\n, \t, \\, \x1b, \xff),
// and cut after `max_bytes` bytes of input, ending in "...". So a message that quotes a line of a
// binary file, or a megabyte-long line, stays one readable line. Every message that quotes input
// uses it.
std::string escape_input(std::string_view input, std::size_t max_bytes = 60);

// A JSON parser's error made fit to quote: nlohmann::json's parse_error `what` ("[json.exception.
// parse_error.101] parse error at line 1, column 3: syntax error ...; last read: '<raw bytes>'")
// without its tag and without the raw bytes it quotes, which can be binary or a whole line; the
// bytes of `input` around the parser's position `byte` (parse_error::byte, 1-based), escaped by
// escape_input, instead: "parse error at line 1, column 3: ...; near '...\x89PNG...'". Every
// message about JSON that loom or a plugin reads uses it.
std::string json_parse_error(std::string_view what, std::size_t byte, std::string_view input);

}  // namespace loom
