// loom::Value: the configuration value tree every component is built from.
//
// A Value is what a YAML scalar, sequence or mapping becomes once the config system has resolved
// includes and overrides: null, bool, integer, floating point number, string, list or map (keys
// kept in the order they were written). Each Value remembers where it came from (file, line and
// column, or the command-line override that set it) so that any error about it can point there.
//
// Values are plain data with value semantics: copying a Value copies the tree. They are built by
// the config system on the main thread and read by plugins during component creation; a const
// Value may be read from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// Where a configuration value was written. `file` is empty for values that came from defaults.
struct SourceLocation {
  std::string file;  // a path, or "<command line>" for overrides
  int line = 0;      // 1-based; 0 when unknown
  int column = 0;    // 1-based; 0 when unknown

  bool known() const { return !file.empty(); }
  // "configs/x.yaml:12:5", "<command line>" or "" when unknown.
  std::string str() const;
};

class Value {
 public:
  enum class Type { null, boolean, integer, number, string, list, map };
  using List = std::vector<Value>;
  using Map = std::vector<std::pair<std::string, Value>>;

  Value() = default;
  Value(std::nullptr_t) {}
  Value(bool b) : data_(b) {}
  Value(int i) : data_(static_cast<std::int64_t>(i)) {}
  Value(std::int64_t i) : data_(i) {}
  Value(double d) : data_(d) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(List l) : data_(std::move(l)) {}
  static Value map() { return Value(Map{}); }

  Type type() const { return static_cast<Type>(data_.index()); }
  bool is_null() const { return type() == Type::null; }
  bool is_bool() const { return type() == Type::boolean; }
  bool is_int() const { return type() == Type::integer; }
  // True for integers too: an integer is a valid number.
  bool is_number() const { return type() == Type::number || type() == Type::integer; }
  bool is_string() const { return type() == Type::string; }
  bool is_list() const { return type() == Type::list; }
  bool is_map() const { return type() == Type::map; }

  // Typed access. Each throws loom::UserError naming the value's location when the type differs.
  bool as_bool() const;
  std::int64_t as_int() const;
  double as_double() const;  // accepts integers
  const std::string& as_string() const;
  const List& as_list() const;
  List& as_list();
  const Map& as_map() const;
  Map& as_map();

  // Map access. find returns nullptr when the key is absent (or this is not a map).
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  // Inserts or replaces `key`, keeping the position of an existing key.
  Value& set(std::string_view key, Value v);
  bool erase(std::string_view key);

  // Dotted-path access ("model.attention.type"); nullptr when any step is missing.
  const Value* at_path(std::string_view dotted) const;

  const SourceLocation& location() const { return location_; }
  void set_location(SourceLocation loc) { location_ = std::move(loc); }
  // Sets the location of this value and every child that has none.
  void set_location_recursive(const SourceLocation& loc);

  // A short description for messages: `"abc"`, `3`, `a list of 2`, `a map`, `null`.
  std::string describe() const;
  // The type in words: "a boolean", "an integer", ...
  static std::string_view type_name(Type t);

  // Flow-style YAML for one line ("[1, 2]", "{a: 1}") and block-style YAML for documents.
  std::string to_flow() const;
  std::string to_yaml(int indent = 0) const;

  // Structural equality; locations are ignored.
  friend bool operator==(const Value& a, const Value& b);

 private:
  explicit Value(Map m) : data_(std::move(m)) {}
  std::variant<std::monostate, bool, std::int64_t, double, std::string, List, Map> data_;
  SourceLocation location_;
};

}  // namespace loom
