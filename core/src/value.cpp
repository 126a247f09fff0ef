#include "loom/value.hpp"

#include <cmath>
#include <sstream>

#include "loom/error.hpp"

namespace loom {

std::string SourceLocation::str() const {
  if (file.empty()) return "";
  if (line <= 0) return file;
  std::string out = file;
  out += ':';
  out += std::to_string(line);
  if (column > 0) {
    out += ':';
    out += std::to_string(column);
  }
  return out;
}

std::string_view Value::type_name(Type t) {
  switch (t) {
    case Type::null:
      return "null";
    case Type::boolean:
      return "a boolean";
    case Type::integer:
      return "an integer";
    case Type::number:
      return "a number";
    case Type::string:
      return "a string";
    case Type::list:
      return "a list";
    case Type::map:
      return "a map";
  }
  return "?";
}

namespace {
[[noreturn]] void type_mismatch(const Value& v, std::string_view wanted) {
  std::string where = v.location().str();
  throw UserError((where.empty() ? "" : where + ": ") + "expected " + std::string(wanted) + ", got " + v.describe());
}

bool needs_quotes(const std::string& s) {
  if (s.empty()) return true;
  static const char* specials = ":#{}[],&*!|>'\"%@`";
  if (s.find_first_of(specials) != std::string::npos) return true;
  if (s.front() == ' ' || s.back() == ' ' || s.front() == '-' || s.front() == '?') return true;
  if (s.find('\n') != std::string::npos || s.find('\t') != std::string::npos) return true;
  // Would read back as something other than a string.
  static const char* words[] = {"null",  "Null", "NULL", "~",  "true", "True", "TRUE", "false", "False",
                                "FALSE", "yes",  "no",   "on", "off",  "Yes",  "No",   "On",    "Off"};
  for (const char* w : words)
    if (s == w) return true;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  if (end && *end == '\0') return true;
  return s == ".inf" || s == "-.inf" || s == ".nan" || s == ".NaN" || s == ".Inf";
}

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += c;
    }
  }
  return out + "\"";
}

std::string format_double(double d) {
  if (std::isnan(d)) return ".nan";
  if (std::isinf(d)) return d > 0 ? ".inf" : "-.inf";
  std::ostringstream os;
  os.precision(17);
  os << d;
  std::string s = os.str();
  // Shortest round-tripping form.
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t.precision(p);
    t << d;
    if (std::stod(t.str()) == d) {
      s = t.str();
      break;
    }
  }
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

std::string scalar_text(const Value& v) {
  switch (v.type()) {
    case Value::Type::null:
      return "null";
    case Value::Type::boolean:
      return v.as_bool() ? "true" : "false";
    case Value::Type::integer:
      return std::to_string(v.as_int());
    case Value::Type::number:
      return format_double(v.as_double());
    case Value::Type::string:
      return needs_quotes(v.as_string()) ? quote(v.as_string()) : v.as_string();
    default:
      return "";
  }
}
}  // namespace

bool Value::as_bool() const {
  if (!is_bool()) type_mismatch(*this, "a boolean");
  return std::get<bool>(data_);
}
std::int64_t Value::as_int() const {
  if (!is_int()) type_mismatch(*this, "an integer");
  return std::get<std::int64_t>(data_);
}
double Value::as_double() const {
  if (is_int()) return static_cast<double>(std::get<std::int64_t>(data_));
  if (type() != Type::number) type_mismatch(*this, "a number");
  return std::get<double>(data_);
}
const std::string& Value::as_string() const {
  if (!is_string()) type_mismatch(*this, "a string");
  return std::get<std::string>(data_);
}
const Value::List& Value::as_list() const {
  if (!is_list()) type_mismatch(*this, "a list");
  return std::get<List>(data_);
}
Value::List& Value::as_list() {
  if (!is_list()) type_mismatch(*this, "a list");
  return std::get<List>(data_);
}
const Value::Map& Value::as_map() const {
  if (!is_map()) type_mismatch(*this, "a map");
  return std::get<Map>(data_);
}
Value::Map& Value::as_map() {
  if (!is_map()) type_mismatch(*this, "a map");
  return std::get<Map>(data_);
}

const Value* Value::find(std::string_view key) const {
  if (!is_map()) return nullptr;
  for (const auto& [k, v] : std::get<Map>(data_))
    if (k == key) return &v;
  return nullptr;
}
Value* Value::find(std::string_view key) {
  return const_cast<Value*>(std::as_const(*this).find(key));
}

Value& Value::set(std::string_view key, Value v) {
  Map& m = as_map();
  for (auto& [k, old] : m)
    if (k == key) return old = std::move(v);
  m.emplace_back(std::string(key), std::move(v));
  return m.back().second;
}

bool Value::erase(std::string_view key) {
  Map& m = as_map();
  for (auto it = m.begin(); it != m.end(); ++it)
    if (it->first == key) {
      m.erase(it);
      return true;
    }
  return false;
}

const Value* Value::at_path(std::string_view dotted) const {
  const Value* v = this;
  while (v && !dotted.empty()) {
    auto dot = dotted.find('.');
    v = v->find(dotted.substr(0, dot));
    dotted = dot == std::string_view::npos ? std::string_view{} : dotted.substr(dot + 1);
  }
  return v;
}

void Value::set_location_recursive(const SourceLocation& loc) {
  if (!location_.known()) location_ = loc;
  if (is_list())
    for (auto& v : std::get<List>(data_)) v.set_location_recursive(loc);
  if (is_map())
    for (auto& [k, v] : std::get<Map>(data_)) v.set_location_recursive(loc);
}

std::string Value::describe() const {
  switch (type()) {
    case Type::null:
      return "null";
    case Type::list: {
      auto n = as_list().size();
      return n <= 4 ? to_flow() : "a list of " + std::to_string(n);
    }
    case Type::map:
      return as_map().empty() ? "{}" : "a map";
    case Type::string:
      return quote(as_string());
    default:
      return scalar_text(*this);
  }
}

std::string Value::to_flow() const {
  if (is_list()) {
    std::string s = "[";
    for (const auto& v : as_list()) s += (s.size() > 1 ? ", " : "") + v.to_flow();
    return s + "]";
  }
  if (is_map()) {
    std::string s = "{";
    for (const auto& [k, v] : as_map()) s += (s.size() > 1 ? ", " : "") + k + ": " + v.to_flow();
    return s + "}";
  }
  return scalar_text(*this);
}

std::string Value::to_yaml(int indent) const {
  const std::string pad(indent, ' ');
  std::string out;
  if (is_map()) {
    if (as_map().empty()) return pad + "{}\n";
    for (const auto& [k, v] : as_map()) {
      const bool nested =
          (v.is_map() && !v.as_map().empty()) ||
          (v.is_list() && !v.as_list().empty() && (v.as_list().front().is_map() || v.as_list().size() > 8));
      if (nested)
        out += pad + k + ":\n" + v.to_yaml(indent + 2);
      else
        out += pad + k + ": " + v.to_flow() + "\n";
    }
    return out;
  }
  if (is_list()) {
    for (const auto& v : as_list()) {
      if (v.is_map() && !v.as_map().empty()) {
        std::string inner = v.to_yaml(indent + 2);
        inner.replace(static_cast<std::size_t>(indent), 2, "- ");
        out += inner;
      } else {
        out += pad + "- " + v.to_flow() + "\n";
      }
    }
    return out;
  }
  return pad + to_flow() + "\n";
}

bool operator==(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number() && a.type() != b.type()) return false;
  return a.data_ == b.data_;
}

}  // namespace loom
