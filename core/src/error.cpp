#include "loom/error.hpp"

#include <cxxabi.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>

#include "loom/utf8.hpp"

namespace loom {

Error::Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {
  rebuild();
}
Error::~Error() = default;
UserError::~UserError() = default;
DeviceUnavailable::~DeviceUnavailable() = default;
InternalError::~InternalError() = default;

void Error::add_context(std::string context) {
  context_.insert(context_.begin(), std::move(context));
  rebuild();
}

void Error::rebuild() {
  full_.clear();
  for (const auto& c : context_) full_ += c + ": ";
  full_ += message_;
}

std::string describe_current_exception() {
  std::string what = "an exception that is not a std::exception";
  if (const std::type_info* type = abi::__cxa_current_exception_type()) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(type->name(), nullptr, nullptr, &status),
                                                std::free);
    what += " (of type " + std::string(status == 0 && name ? name.get() : type->name()) + ")";
  }
  return what;
}

namespace {
// Optimal string alignment distance: insertions, deletions, substitutions and transpositions of
// adjacent characters ("gtp2" is one edit from "gpt2"), ignoring case.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  auto same = [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  };
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same(a[i - 1], b[j - 1]) ? 0 : 1)});
      if (i > 1 && j > 1 && same(a[i - 1], b[j - 2]) && same(a[i - 2], b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}
}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) return "";
  // Close enough to be a typo: at most a third of the longer word's length.
  const std::size_t limit = std::max<std::size_t>(1, std::max(word.size(), best.size()) / 3);
  return best_distance <= limit ? best : "";
}

std::string escape_input(std::string_view input, std::size_t max_bytes) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  std::size_t i = 0;
  while (i < input.size() && i < max_bytes) {
    const auto b = static_cast<unsigned char>(input[i]);
    if (b >= 0x80) {
      // A valid multi-byte character is printable text; anything else is shown byte by byte.
      const Utf8Char c = decode_utf8(input, i);
      if (c.length > 0 && c.code_point >= 0xA0) {
        if (i + c.length > max_bytes) break;
        out.append(input.substr(i, c.length));
        i += c.length;
        continue;
      }
    }
    switch (b) {
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\\':
        out += "\\\\";
        break;
      default:
        if (b < 0x20 || b >= 0x7f) {
          out += "\\x";
          out += hex[b >> 4];
          out += hex[b & 15];
        } else {
          out += static_cast<char>(b);
        }
    }
    ++i;
  }
  if (i < input.size()) out += "...";
  return out;
}

std::string json_parse_error(std::string_view what, std::size_t byte, std::string_view input) {
  std::string message(what);
  if (const auto close = message.find("] "); message.starts_with("[json.exception") && close != std::string::npos)
    message.erase(0, close + 2);
  if (const auto last = message.find("; last read: "); last != std::string::npos) message.erase(last);
  const std::size_t at = std::min<std::size_t>(byte > 0 ? byte - 1 : 0, input.size());
  const std::size_t from = at > 20 ? at - 20 : 0;
  return message + "; near '" + (from > 0 ? "..." : "") + escape_input(input.substr(from), at - from + 20) + "'";
}

}  // namespace loom
