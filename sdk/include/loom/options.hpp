// Declared options: how a component says what it accepts, and how it reads what it was given.
//
// A component declares its options once, in its registration (name, type, default, one-line doc,
// allowed range). From that single declaration loom
//   * validates the config node the component is created from: an unknown key, a wrong type or
//     an out-of-range value is a UserError naming the file and line, the key path, what was
//     expected and the closest valid key;
//   * fills in defaults (`loom config show` prints the result);
//   * documents the component (`loom config schema`, docs/).
//
//   loom::OptionSchema s;
//   s.number("decay_rate", 0.5, "Factor applied every `decay_steps` steps.").range(0.0, 1.0, false);
//   s.integer("decay_steps", 1000, "Steps per decay.").min(1);
//
// and in the component:
//
//   explicit Exponential(const loom::Options& o)
//       : rate_(o.get<double>("decay_rate")), steps_(o.get<std::int64_t>("decay_steps")) {}
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/value.hpp"

namespace loom {

enum class OptionType {
  boolean,
  integer,
  number,  // floating point; integers are accepted
  string,
  list,       // of `element` values
  object,     // a nested map validated by its own schema
  component,  // another component, by name ("flash") or map ({type: flash, ...})
  any,        // not validated (free-form maps, such as a tracker's tags)
};
std::string_view option_type_name(OptionType t);

class OptionSchema;

// One declared option. Built through OptionSchema's methods; the setters return *this so that
// range and choices read on the declaring line.
class OptionSpec {
 public:
  OptionSpec(std::string name, OptionType type, Value default_value, std::string doc);

  // Inclusive bounds unless `inclusive` is false. Apply to integers, numbers and list elements.
  OptionSpec& min(double v, bool inclusive = true);
  OptionSpec& max(double v, bool inclusive = true);
  OptionSpec& range(double lo, double hi, bool inclusive = true) { return min(lo, inclusive).max(hi, inclusive); }
  // Allowed values of a string option (or of a list of strings).
  OptionSpec& one_of(std::vector<std::string> choices);
  // The option may be null ("unset"); its default is then usually null too.
  OptionSpec& nullable(bool v = true);
  // The option has no default and must be given.
  OptionSpec& required();
  // Bounds on a list's length.
  OptionSpec& length(std::size_t lo, std::size_t hi);
  // For components: options that the component's section takes besides the component's own,
  // read by whoever declares the section, not by the component (the run layer's
  // `optimizer.learning_rate`). They are validated, defaulted and documented with the
  // component's options, whichever component the section names, and never reach its factory.
  OptionSpec& section_options(OptionSchema schema);

  const std::string& name() const { return name_; }
  OptionType type() const { return type_; }
  const Value& default_value() const { return default_; }
  const std::string& doc() const { return doc_; }
  const std::optional<double>& min_value() const { return min_; }
  const std::optional<double>& max_value() const { return max_; }
  bool min_inclusive() const { return min_inclusive_; }
  bool max_inclusive() const { return max_inclusive_; }
  const std::vector<std::string>& choices() const { return choices_; }
  bool is_nullable() const { return nullable_; }
  bool is_required() const { return required_; }
  std::size_t min_length() const { return min_length_; }
  std::size_t max_length() const { return max_length_; }
  // For lists: the element type. For components: the kind.
  OptionType element_type() const { return element_; }
  const std::string& component_kind() const { return component_kind_; }
  // For objects: the nested schema.
  const std::shared_ptr<const OptionSchema>& object_schema() const { return object_; }
  // For components: the section's own options (null when it has none).
  const std::shared_ptr<const OptionSchema>& section_schema() const { return section_; }

  // "a number in [0, 1]", "one of gelu, silu", "a list of 2 numbers": what a valid value is.
  std::string expectation() const;

 private:
  friend class OptionSchema;
  friend OptionSchema section_schema(const OptionSchema&, const OptionSchema&, std::string_view);
  std::string name_;
  OptionType type_;
  Value default_;
  std::string doc_;
  std::optional<double> min_, max_;
  bool min_inclusive_ = true, max_inclusive_ = true;
  std::vector<std::string> choices_;
  bool nullable_ = false, required_ = false;
  std::size_t min_length_ = 0, max_length_ = static_cast<std::size_t>(-1);
  OptionType element_ = OptionType::any;
  std::string component_kind_;
  std::shared_ptr<const OptionSchema> object_;
  std::shared_ptr<const OptionSchema> section_;
};

// The ordered set of options a component (or a core section such as `trainer`) accepts.
class OptionSchema {
 public:
  OptionSpec& boolean(std::string name, bool default_value, std::string doc);
  OptionSpec& integer(std::string name, std::int64_t default_value, std::string doc);
  OptionSpec& number(std::string name, double default_value, std::string doc);
  OptionSpec& string(std::string name, std::string default_value, std::string doc);
  // A list whose elements are of type `element` (boolean, integer, number or string).
  OptionSpec& list(std::string name, OptionType element, Value::List default_value, std::string doc);
  // A nested map with its own schema; its defaults are filled in like the parent's.
  OptionSpec& object(std::string name, OptionSchema schema, std::string doc);
  // Another component of `kind`; `default_name` may be "" (then the option is required unless
  // made nullable).
  OptionSpec& component(std::string name, std::string kind, std::string default_name, std::string doc);
  // Any value, unvalidated.
  OptionSpec& any(std::string name, Value default_value, std::string doc);

  // Adds `more`'s options after this schema's own. InternalError when a name is in both.
  OptionSchema& append(const OptionSchema& more);

  // A component's own default for an option of the section it sits in (see
  // OptionSpec::section_options), which the component neither declares nor reads: Lion suggests a
  // smaller `learning_rate` than the optimizer section's default.
  OptionSchema& section_default(std::string name, Value value);
  const std::vector<std::pair<std::string, Value>>& section_defaults() const { return section_defaults_; }

  const std::vector<OptionSpec>& options() const { return options_; }
  const OptionSpec* find(std::string_view name) const;
  std::vector<std::string> names() const;
  bool empty() const { return options_.empty(); }

 private:
  friend OptionSchema section_schema(const OptionSchema&, const OptionSchema&, std::string_view);
  OptionSpec& add(OptionSpec spec);
  std::vector<OptionSpec> options_;
  std::vector<std::pair<std::string, Value>> section_defaults_;
};

// What a component's section accepts: the `section` options (with the defaults `component`
// suggests for them) followed by the component's own. UserError when the component (`what`,
// "optimizer 'lion'") declares a section option itself, or suggests a default for an option the
// section lacks or one outside its range.
OptionSchema section_schema(const OptionSchema& section, const OptionSchema& component, std::string_view what);

// A reference to a component, as given by a `component` option: its name and its own options
// (still to be validated against that component's schema when it is created).
struct ComponentRef {
  std::string kind;
  std::string name;
  Value node;        // the whole map, `type` included; a bare name becomes {type: name}
  std::string path;  // key path in the config, for messages ("model.attention")
};

// A validated, defaults-filled option map, as handed to a component's factory. Getting an
// option that the schema does not declare, or as the wrong type, is an InternalError (a bug in
// the component, not in the user's config: the user's config was validated already).
class Options {
 public:
  Options() = default;
  Options(Value values, std::string path) : values_(std::move(values)), path_(std::move(path)) {}

  template <class T>
  T get(std::string_view name) const;

  // nullopt when the option is null.
  template <class T>
  std::optional<T> get_optional(std::string_view name) const {
    const Value& v = raw(name);
    if (v.is_null()) return std::nullopt;
    return get<T>(name);
  }

  bool is_null(std::string_view name) const { return raw(name).is_null(); }
  // A nested `object` option.
  Options object(std::string_view name) const;
  // A `component` option, ready to pass to CreateContext::create.
  ComponentRef component(std::string_view name) const;
  // The raw value of an option (throws InternalError when undeclared).
  const Value& raw(std::string_view name) const;

  // The whole validated map, and the key path it sits at ("optimizer").
  const Value& values() const { return values_; }
  const std::string& path() const { return path_; }

 private:
  Value values_ = Value::map();
  std::string path_;
};

template <>
bool Options::get<bool>(std::string_view) const;
template <>
std::int64_t Options::get<std::int64_t>(std::string_view) const;
template <>
int Options::get<int>(std::string_view) const;
template <>
double Options::get<double>(std::string_view) const;
template <>
float Options::get<float>(std::string_view) const;
template <>
std::string Options::get<std::string>(std::string_view) const;
template <>
std::vector<std::int64_t> Options::get<std::vector<std::int64_t>>(std::string_view) const;
template <>
std::vector<double> Options::get<std::vector<double>>(std::string_view) const;
template <>
std::vector<std::string> Options::get<std::vector<std::string>>(std::string_view) const;

}  // namespace loom
