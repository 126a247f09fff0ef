#include "loom/options.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "loom/error.hpp"

namespace loom {

std::string_view option_type_name(OptionType t) {
  switch (t) {
    case OptionType::boolean:
      return "bool";
    case OptionType::integer:
      return "int";
    case OptionType::number:
      return "float";
    case OptionType::string:
      return "string";
    case OptionType::list:
      return "list";
    case OptionType::object:
      return "object";
    case OptionType::component:
      return "component";
    case OptionType::any:
      return "any";
  }
  return "?";
}

OptionSpec::OptionSpec(std::string name, OptionType type, Value default_value, std::string doc)
    : name_(std::move(name)), type_(type), default_(std::move(default_value)), doc_(std::move(doc)) {}

OptionSpec& OptionSpec::min(double v, bool inclusive) {
  min_ = v;
  min_inclusive_ = inclusive;
  return *this;
}
OptionSpec& OptionSpec::max(double v, bool inclusive) {
  max_ = v;
  max_inclusive_ = inclusive;
  return *this;
}
OptionSpec& OptionSpec::one_of(std::vector<std::string> choices) {
  choices_ = std::move(choices);
  return *this;
}
OptionSpec& OptionSpec::nullable(bool v) {
  nullable_ = v;
  return *this;
}
OptionSpec& OptionSpec::required() {
  required_ = true;
  default_ = Value();
  return *this;
}
OptionSpec& OptionSpec::section_options(OptionSchema schema) {
  if (type_ != OptionType::component)
    throw InternalError("option '" + name_ + "': only a component option has section options");
  section_ = std::make_shared<const OptionSchema>(std::move(schema));
  return *this;
}
OptionSpec& OptionSpec::length(std::size_t lo, std::size_t hi) {
  min_length_ = lo;
  max_length_ = hi;
  return *this;
}

namespace {
std::string number_text(double v) {
  // A whole bound as the integer it is (1048576, not 1.04858e+06).
  if (v == std::floor(v) && std::abs(v) < 9.0e15) return std::to_string(static_cast<std::int64_t>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}
std::string plural(OptionType t) {
  switch (t) {
    case OptionType::boolean:
      return "booleans";
    case OptionType::integer:
      return "integers";
    case OptionType::number:
      return "numbers";
    case OptionType::string:
      return "strings";
    default:
      return "values";
  }
}
}  // namespace

std::string OptionSpec::expectation() const {
  std::string s;
  switch (type_) {
    case OptionType::boolean:
      s = "a boolean (true or false)";
      break;
    case OptionType::integer:
      s = "an integer";
      break;
    case OptionType::number:
      s = "a number";
      break;
    case OptionType::string:
      s = "a string";
      break;
    case OptionType::list: {
      s = "a list";
      if (min_length_ == max_length_)
        s += " of " + std::to_string(min_length_);
      else if (max_length_ != static_cast<std::size_t>(-1))
        s += " of " + std::to_string(min_length_) + " to " + std::to_string(max_length_);
      s +=
          (min_length_ == max_length_ || max_length_ != static_cast<std::size_t>(-1) ? " " : " of ") +
          (min_length_ == max_length_ && min_length_ == 1 ? std::string(option_type_name(element_)) : plural(element_));
      break;
    }
    case OptionType::object:
      s = "a map";
      break;
    case OptionType::component: {
      const bool vowel =
          !component_kind_.empty() && std::string_view("aeiou").find(component_kind_[0]) != std::string_view::npos;
      s = std::string("the name of ") + (vowel ? "an " : "a ") + component_kind_ + " (or a map with `type`)";
      break;
    }
    case OptionType::any:
      s = "any value";
      break;
  }
  if (min_ && max_) {
    s += std::string(" in ") + (min_inclusive_ ? "[" : "(") + number_text(*min_) + ", " + number_text(*max_) +
         (max_inclusive_ ? "]" : ")");
  } else if (min_) {
    s += std::string(min_inclusive_ ? " >= " : " > ") + number_text(*min_);
  } else if (max_) {
    s += std::string(max_inclusive_ ? " <= " : " < ") + number_text(*max_);
  }
  if (!choices_.empty()) {
    s += ", one of ";
    for (std::size_t i = 0; i < choices_.size(); ++i) s += (i ? ", " : "") + choices_[i];
  }
  if (nullable_) s += ", or null";
  return s;
}

OptionSpec& OptionSchema::add(OptionSpec spec) {
  for (const auto& o : options_)
    if (o.name() == spec.name()) throw InternalError("option '" + spec.name() + "' is declared twice");
  options_.push_back(std::move(spec));
  return options_.back();
}

OptionSpec& OptionSchema::boolean(std::string name, bool default_value, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::boolean, default_value, std::move(doc)));
}
OptionSpec& OptionSchema::integer(std::string name, std::int64_t default_value, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::integer, default_value, std::move(doc)));
}
OptionSpec& OptionSchema::number(std::string name, double default_value, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::number, default_value, std::move(doc)));
}
OptionSpec& OptionSchema::string(std::string name, std::string default_value, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::string, std::move(default_value), std::move(doc)));
}
OptionSpec& OptionSchema::list(std::string name, OptionType element, Value::List default_value, std::string doc) {
  if (element != OptionType::boolean && element != OptionType::integer && element != OptionType::number &&
      element != OptionType::string)
    throw InternalError("list option '" + name + "': elements must be booleans, integers, numbers or strings");
  auto& spec = add(OptionSpec(std::move(name), OptionType::list, Value(std::move(default_value)), std::move(doc)));
  spec.element_ = element;
  return spec;
}
OptionSpec& OptionSchema::object(std::string name, OptionSchema schema, std::string doc) {
  auto& spec = add(OptionSpec(std::move(name), OptionType::object, Value::map(), std::move(doc)));
  spec.object_ = std::make_shared<const OptionSchema>(std::move(schema));
  return spec;
}
OptionSpec& OptionSchema::component(std::string name, std::string kind, std::string default_name, std::string doc) {
  Value def = default_name.empty() ? Value() : Value(std::move(default_name));
  auto& spec = add(OptionSpec(std::move(name), OptionType::component, std::move(def), std::move(doc)));
  spec.component_kind_ = std::move(kind);
  if (spec.default_value().is_null()) spec.required_ = true;
  return spec;
}
OptionSpec& OptionSchema::boolean(std::string name, std::nullopt_t, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::boolean, Value(), std::move(doc))).nullable();
}
OptionSpec& OptionSchema::integer(std::string name, std::nullopt_t, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::integer, Value(), std::move(doc))).nullable();
}
OptionSpec& OptionSchema::number(std::string name, std::nullopt_t, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::number, Value(), std::move(doc))).nullable();
}
OptionSpec& OptionSchema::string(std::string name, std::nullopt_t, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::string, Value(), std::move(doc))).nullable();
}
OptionSpec& OptionSchema::list(std::string name, OptionType element, std::nullopt_t, std::string doc) {
  OptionSpec& spec = list(std::move(name), element, Value::List{}, std::move(doc));
  spec.default_ = Value();
  return spec.nullable();
}
OptionSpec& OptionSchema::component(std::string name, std::string kind, std::nullopt_t, std::string doc) {
  OptionSpec& spec = component(std::move(name), std::move(kind), std::string(), std::move(doc));
  spec.required_ = false;
  return spec.nullable();
}
OptionSpec& OptionSchema::any(std::string name, Value default_value, std::string doc) {
  return add(OptionSpec(std::move(name), OptionType::any, std::move(default_value), std::move(doc)));
}

OptionSchema& OptionSchema::append(const OptionSchema& more) {
  for (const auto& o : more.options()) add(o);
  return *this;
}

OptionSchema& OptionSchema::section_default(std::string name, Value value) {
  section_defaults_.emplace_back(std::move(name), std::move(value));
  return *this;
}

OptionSchema section_schema(const OptionSchema& section, const OptionSchema& component, std::string_view what) {
  const std::string w(what);
  for (const auto& o : component.options())
    if (section.find(o.name()))
      throw UserError(w + " declares the option '" + o.name() +
                      "', which its section has already (loom reads it, not the component): the plugin must not "
                      "declare it (it may suggest a default with OptionSchema::section_default)");
  OptionSchema merged = section;
  merged.section_defaults_.clear();
  for (const auto& [name, value] : component.section_defaults()) {
    OptionSpec* spec = nullptr;
    for (auto& o : merged.options_)
      if (o.name() == name) spec = &o;
    if (!spec)
      throw UserError(w + " suggests a default for '" + name + "', which is not an option of its section (" +
                      (merged.empty() ? std::string("it has none")
                                      : "it has " +
                                            [&] {
                                              std::string all;
                                              for (const auto& n : merged.names()) all += (all.empty() ? "" : ", ") + n;
                                              return all;
                                            }()) +
                      ")");
    const bool number = spec->type() == OptionType::number || spec->type() == OptionType::integer;
    const bool in_range =
        !number || (value.is_number() &&
                    (!spec->min_value() || (spec->min_inclusive() ? value.as_double() >= *spec->min_value()
                                                                  : value.as_double() > *spec->min_value())) &&
                    (!spec->max_value() || (spec->max_inclusive() ? value.as_double() <= *spec->max_value()
                                                                  : value.as_double() < *spec->max_value())));
    if (!in_range)
      throw UserError(w + " suggests " + value.to_flow() + " as the default of '" + name + "', which expects " +
                      spec->expectation());
    spec->default_ = value;
  }
  return merged.append(component);
}

const OptionSpec* OptionSchema::find(std::string_view name) const {
  for (const auto& o : options_)
    if (o.name() == name) return &o;
  return nullptr;
}

std::vector<std::string> OptionSchema::names() const {
  std::vector<std::string> n;
  for (const auto& o : options_) n.push_back(o.name());
  return n;
}

// ---- Options ----

const Value& Options::raw(std::string_view name) const {
  const Value* v = values_.find(name);
  if (!v)
    throw InternalError("option '" + std::string(name) + "' of " + (path_.empty() ? "component" : path_) +
                        " is read but was never declared");
  return *v;
}

namespace {
template <class F>
auto read_as(const Options& o, std::string_view name, F&& f) {
  const Value& v = o.raw(name);
  try {
    return f(v);
  } catch (const UserError& e) {
    throw InternalError("option '" + std::string(name) + "' of " + o.path() +
                        " read as the wrong type: " + e.message());
  }
}
}  // namespace

template <>
bool Options::get<bool>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) { return v.as_bool(); });
}
template <>
std::int64_t Options::get<std::int64_t>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) { return v.as_int(); });
}
template <>
int Options::get<int>(std::string_view name) const {
  // A component that reads an integer as an int declares a range within it; one that does not is
  // still never handed a value that wraps (4294967297 read as 1).
  const std::int64_t value = get<std::int64_t>(name);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
    const SourceLocation& at = raw(name).location();
    throw UserError((at.known() ? at.str() + ": " : std::string()) + (path_.empty() ? "" : path_ + ".") +
                    std::string(name) + " is " + std::to_string(value) + ": out of range (an int: [" +
                    std::to_string(std::numeric_limits<int>::min()) + ", " +
                    std::to_string(std::numeric_limits<int>::max()) + "])");
  }
  return static_cast<int>(value);
}
template <>
double Options::get<double>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) { return v.as_double(); });
}
template <>
float Options::get<float>(std::string_view name) const {
  return static_cast<float>(get<double>(name));
}
template <>
std::string Options::get<std::string>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) { return v.as_string(); });
}
template <>
std::vector<std::int64_t> Options::get<std::vector<std::int64_t>>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) {
    std::vector<std::int64_t> out;
    for (const auto& e : v.as_list()) out.push_back(e.as_int());
    return out;
  });
}
template <>
std::vector<double> Options::get<std::vector<double>>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) {
    std::vector<double> out;
    for (const auto& e : v.as_list()) out.push_back(e.as_double());
    return out;
  });
}
template <>
std::vector<std::string> Options::get<std::vector<std::string>>(std::string_view name) const {
  return read_as(*this, name, [](const Value& v) {
    std::vector<std::string> out;
    for (const auto& e : v.as_list()) out.push_back(e.as_string());
    return out;
  });
}

Options Options::object(std::string_view name) const {
  const Value& v = raw(name);
  if (!v.is_map()) throw InternalError("option '" + std::string(name) + "' of " + path_ + " is not an object");
  return Options(v, path_.empty() ? std::string(name) : path_ + "." + std::string(name));
}

ComponentRef Options::component(std::string_view name) const {
  const Value& v = raw(name);
  const std::string path = path_.empty() ? std::string(name) : path_ + "." + std::string(name);
  if (!v.is_map() || !v.find("type") || !v.find("type")->is_string())
    throw InternalError("option '" + path + "' is not a validated component");
  return ComponentRef{"", v.find("type")->as_string(), v, path};
}

}  // namespace loom
