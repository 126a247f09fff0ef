// Options bound to the fields of a struct: each option written once.
//
// With OptionSchema alone (options.hpp) a component names each option twice and types it three
// times: in the declaration, in `options.get<T>("name")` and in the field it reads it into. An
// OptionBinding<Config> declares each option together with the field that holds it, and reads
// the whole struct from the validated options:
//
//   struct DecayOptions {
//     double rate;
//     std::int64_t steps;
//     bool staircase;
//   };
//
//   loom::OptionBinding<DecayOptions> decay_options() {
//     loom::OptionBinding<DecayOptions> b;
//     b.field("decay_rate", &DecayOptions::rate, 0.5, "Factor applied every `decay_steps` steps.").range(0.0, 1.0);
//     b.field("decay_steps", &DecayOptions::steps, 1000, "Steps per decay.").min(1);
//     b.field("staircase", &DecayOptions::staircase, false, "Decay in whole steps of `decay_steps`.");
//     return b;
//   }
//
// and in the registration, the declaration and the reading from the one binding:
//
//   const auto options = decay_options();
//   registrar.add<loom::LrSchedule>({..., .options = options.schema()},
//       [options](const loom::Options& o, const loom::CreateContext&) {
//         return std::make_unique<Decay>(options.read(o));
//       });
//
// The option's type follows from the field's: bool is a boolean, int and std::int64_t an integer,
// float and double a number, std::string a string, std::vector of std::int64_t, double or
// std::string a list, loom::Value any value. A std::optional<T> field reads null as std::nullopt;
// a plain field whose option may be null (declared with std::nullopt, or .nullable()) says what
// null reads as with .null_as(value) or .null_as(function of the fields read before it). Enums
// (and a bool whose two values have names, "after_top_k" and "before_top_k") are bound with
// choice(), nested objects with object(), components with component().
//
// The declaration is the OptionSchema's (schema()), option for option, so `loom config schema`,
// the validation and every message are those of the same options declared on an OptionSchema:
// the two forms can be mixed (schema() also takes options no field holds, read by a then() step).
//
// read() fills a value-initialised Config in declaration order: each bound field, and each
// then() step at the place it was added (after the fields declared before it), which is where a
// component checks combinations (UserError) and derives fields from others.
#pragma once

#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom {

namespace option_binding_detail {

template <class T>
struct Scalar : std::false_type {};
template <>
struct Scalar<bool> : std::true_type {
  static constexpr OptionType type = OptionType::boolean;
};
template <>
struct Scalar<int> : std::true_type {
  static constexpr OptionType type = OptionType::integer;
};
template <>
struct Scalar<std::int64_t> : std::true_type {
  static constexpr OptionType type = OptionType::integer;
};
template <>
struct Scalar<float> : std::true_type {
  static constexpr OptionType type = OptionType::number;
};
template <>
struct Scalar<double> : std::true_type {
  static constexpr OptionType type = OptionType::number;
};
template <>
struct Scalar<std::string> : std::true_type {
  static constexpr OptionType type = OptionType::string;
};

template <class T>
struct List : std::false_type {};
template <class E>
requires(std::same_as<E, std::int64_t> || std::same_as<E, double> ||
         std::same_as<E, std::string>) struct List<std::vector<E>> : std::true_type {
  static constexpr OptionType element = Scalar<E>::type;
};

template <class T>
struct Optional {
  using type = T;
  static constexpr bool value = false;
};
template <class T>
struct Optional<std::optional<T>> {
  using type = T;
  static constexpr bool value = true;
};

}  // namespace option_binding_detail

// A field type that field() binds: a scalar, a list or any Value, or a std::optional of one.
template <class T>
concept BindableOption = option_binding_detail::Scalar<typename option_binding_detail::Optional<T>::type>::value ||
    option_binding_detail::List<typename option_binding_detail::Optional<T>::type>::value || std::same_as<T, Value>;

// The named values of an enum option, in the order `loom config schema` lists them.
template <class E>
using Choices = std::vector<std::pair<std::string, E>>;

template <class Config>
class OptionBinding;

// What field() and its kin return: the declared option's modifiers (OptionSpec's, same meaning),
// and what null reads as. Use it on the declaring line: like OptionSpec&, it is valid until the
// next declaration.
template <class Config, class T>
class BoundOption {
 public:
  BoundOption& min(double v, bool inclusive = true) {
    spec_->min(v, inclusive);
    return *this;
  }
  BoundOption& max(double v, bool inclusive = true) {
    spec_->max(v, inclusive);
    return *this;
  }
  BoundOption& range(double lo, double hi, bool inclusive = true) { return min(lo, inclusive).max(hi, inclusive); }
  BoundOption& one_of(std::vector<std::string> choices) {
    spec_->one_of(std::move(choices));
    return *this;
  }
  BoundOption& nullable(bool v = true) {
    spec_->nullable(v);
    return *this;
  }
  BoundOption& required() {
    spec_->required();
    return *this;
  }
  BoundOption& length(std::size_t lo, std::size_t hi) {
    spec_->length(lo, hi);
    return *this;
  }

  // The field's value when the option is null (a field that is not a std::optional).
  BoundOption& null_as(T value) {
    T Config::*member = member_;
    binding_->steps_[step_].on_null = [member, value](Config& c) { c.*member = value; };
    return *this;
  }
  // The same, computed from the fields read before this one ("null: hidden_dim / num_heads").
  BoundOption& null_as(std::function<T(const Config&)> value) {
    T Config::*member = member_;
    binding_->steps_[step_].on_null = [member, value = std::move(value)](Config& c) { c.*member = value(c); };
    return *this;
  }

  OptionSpec& spec() { return *spec_; }

 private:
  friend class OptionBinding<Config>;
  BoundOption(OptionBinding<Config>* binding, OptionSpec* spec, std::size_t step, T Config::*member)
      : binding_(binding), spec_(spec), step_(step), member_(member) {}
  OptionBinding<Config>* binding_;
  OptionSpec* spec_;
  std::size_t step_;
  T Config::*member_;
};

template <class Config>
class OptionBinding {
  static_assert(std::is_default_constructible_v<Config>,
                "OptionBinding: the options struct must be default-constructible");

 public:
  // Option `name`, held by `member` (of Config or of a base of it), with its default and doc.
  template <class T, class Owner>
  requires BindableOption<T> && std::derived_from<Config, Owner> BoundOption<Config, T> field(
      std::string name, T Owner::*member, std::type_identity_t<T> default_value, std::string doc) {
    using Inner = typename option_binding_detail::Optional<T>::type;
    if constexpr (option_binding_detail::Optional<T>::value) {
      if (!default_value) return field(std::move(name), member, std::nullopt, std::move(doc));
      return declare<T>(member, add_spec<Inner>(std::move(name), to_value(*default_value), std::move(doc)));
    } else {
      return declare<T>(member, add_spec<Inner>(std::move(name), to_value(default_value), std::move(doc)));
    }
  }
  // Option `name`, null unless given (OptionSchema's std::nullopt default).
  template <class T, class Owner>
  requires BindableOption<T> && std::derived_from<Config, Owner> BoundOption<Config, T> field(std::string name,
                                                                                              T Owner::*member,
                                                                                              std::nullopt_t,
                                                                                              std::string doc) {
    using Inner = typename option_binding_detail::Optional<T>::type;
    return declare<T>(member, add_spec<Inner>(std::move(name), std::nullopt, std::move(doc)));
  }

  // A string option of the names in `choices`, read as the enum value (or bool) it names.
  template <class E, class Owner>
  requires(std::is_enum_v<E> || std::same_as<E, bool>) &&
      std::derived_from<Config, Owner> BoundOption<Config, E> choice(std::string name, E Owner::*member,
                                                                     E default_value, Choices<E> choices,
                                                                     std::string doc) {
    std::vector<std::string> names;
    std::string default_name;
    for (const auto& [n, v] : choices) {
      names.push_back(n);
      if (v == default_value && default_name.empty()) default_name = n;
    }
    if (default_name.empty()) throw InternalError("option '" + name + "': its default is none of its choices");
    OptionSpec& spec = schema_.string(name, std::move(default_name), std::move(doc)).one_of(std::move(names));
    E Config::*m = member;
    return add_step<E>(name, &spec, m, false, [m, name, choices = std::move(choices)](Config& c, const Options& o) {
      const std::string given = o.get<std::string>(name);
      for (const auto& [n, v] : choices)
        if (n == given) {
          c.*m = v;
          return;
        }
      throw InternalError("option '" + name + "' is '" + given + "', none of its choices");
    });
  }

  // A nested map with its own binding, read into `member`.
  template <class Sub, class Owner>
  requires std::derived_from<Config, Owner> BoundOption<Config, Sub> object(std::string name, Sub Owner::*member,
                                                                            OptionBinding<Sub> binding,
                                                                            std::string doc) {
    OptionSpec& spec = schema_.object(name, binding.schema(), std::move(doc));
    Sub Config::*m = member;
    return add_step<Sub>(name, &spec, m, false, [m, name, binding = std::move(binding)](Config& c, const Options& o) {
      c.*m = binding.read(o.object(name));
    });
  }

  // Another component of `kind` (OptionSchema::component), read as the reference that
  // CreateContext::create takes. A std::optional<ComponentRef> field with std::nullopt for
  // `default_name`: none unless given.
  template <class Ref, class Owner>
  requires(std::same_as<Ref, ComponentRef> || std::same_as<Ref, std::optional<ComponentRef>>) &&
      std::derived_from<Config, Owner> BoundOption<Config, Ref> component(std::string name, Ref Owner::*member,
                                                                          std::string kind,
                                                                          std::optional<std::string> default_name,
                                                                          std::string doc) {
    constexpr bool optional = std::same_as<Ref, std::optional<ComponentRef>>;
    OptionSpec& spec = default_name ? schema_.component(name, std::move(kind), std::move(*default_name), std::move(doc))
                                    : schema_.component(name, std::move(kind), std::nullopt, std::move(doc));
    Ref Config::*m = member;
    return add_step<Ref>(name, &spec, m, optional, [m, name](Config& c, const Options& o) {
      if (o.is_null(name))
        c.*m = Ref{};
      else
        c.*m = o.component(name);
    });
  }

  // Runs `step` at this point of read(), after the fields declared before it: a check of their
  // combination (throw UserError saying what to change) or a field derived from others. `options`
  // is the whole validated map, for options declared on schema() that no field holds.
  OptionBinding& then(std::function<void(Config& config, const Options& options)> step) {
    steps_.push_back({std::string(), std::move(step), nullptr, true});
    return *this;
  }

  // The declaration: the component's ComponentDecl::options. The mutable form declares options
  // that no field holds (read by a then() step).
  const OptionSchema& schema() const { return schema_; }
  OptionSchema& schema() { return schema_; }

  // The struct, read from options validated against schema(). InternalError for a declaration
  // that cannot be read (a plain field whose option may be null without null_as).
  Config read(const Options& options) const {
    for (const Step& s : steps_) {
      if (s.name.empty() || s.reads_null || s.on_null) continue;
      const OptionSpec* spec = schema_.find(s.name);
      if (spec && spec->is_nullable())
        throw InternalError("option '" + s.name + "' of " + (options.path().empty() ? "a component" : options.path()) +
                            " may be null, and its field is not a std::optional: declare what null reads as "
                            "(BoundOption::null_as)");
    }
    Config config{};
    for (const Step& s : steps_) {
      if (!s.name.empty() && !s.reads_null && options.is_null(s.name))
        s.on_null(config);
      else
        s.read(config, options);
    }
    return config;
  }

 private:
  template <class, class>
  friend class BoundOption;

  struct Step {
    std::string name;  // empty: a then() step
    std::function<void(Config&, const Options&)> read;
    std::function<void(Config&)> on_null;  // set by null_as
    bool reads_null;                       // std::optional fields, Value and then() steps read null themselves
  };

  template <class T>
  static Value to_value(const T& v) {
    if constexpr (option_binding_detail::List<T>::value) {
      Value::List list;
      for (const auto& e : v) list.emplace_back(e);
      return list;
    } else if constexpr (std::same_as<T, float>) {
      return Value(static_cast<double>(v));
    } else {
      return Value(v);
    }
  }

  // The OptionSchema declaration of an option of field type Inner (not optional).
  template <class Inner>
  OptionSpec& add_spec(std::string name, std::optional<Value> default_value, std::string doc) {
    if constexpr (std::same_as<Inner, Value>) {
      return schema_.any(std::move(name), default_value ? std::move(*default_value) : Value(), std::move(doc));
    } else if constexpr (option_binding_detail::List<Inner>::value) {
      constexpr OptionType element = option_binding_detail::List<Inner>::element;
      if (!default_value) return schema_.list(std::move(name), element, std::nullopt, std::move(doc));
      return schema_.list(std::move(name), element, default_value->as_list(), std::move(doc));
    } else {
      constexpr OptionType type = option_binding_detail::Scalar<Inner>::type;
      if (!default_value) {
        if constexpr (type == OptionType::boolean)
          return schema_.boolean(std::move(name), std::nullopt, std::move(doc));
        if constexpr (type == OptionType::integer)
          return schema_.integer(std::move(name), std::nullopt, std::move(doc));
        if constexpr (type == OptionType::number) return schema_.number(std::move(name), std::nullopt, std::move(doc));
        if constexpr (type == OptionType::string) return schema_.string(std::move(name), std::nullopt, std::move(doc));
      }
      if constexpr (type == OptionType::boolean)
        return schema_.boolean(std::move(name), default_value->as_bool(), std::move(doc));
      if constexpr (type == OptionType::integer)
        return schema_.integer(std::move(name), default_value->as_int(), std::move(doc));
      if constexpr (type == OptionType::number)
        return schema_.number(std::move(name), default_value->as_double(), std::move(doc));
      if constexpr (type == OptionType::string)
        return schema_.string(std::move(name), default_value->as_string(), std::move(doc));
    }
  }

  template <class T, class Owner>
  BoundOption<Config, T> declare(T Owner::*member, OptionSpec& spec) {
    using Inner = typename option_binding_detail::Optional<T>::type;
    constexpr bool optional = option_binding_detail::Optional<T>::value;
    T Config::*m = member;
    std::string name = spec.name();
    return add_step<T>(name, &spec, m, optional || std::same_as<T, Value>, [m, name](Config& c, const Options& o) {
      if constexpr (std::same_as<T, Value>)
        c.*m = o.raw(name);
      else if constexpr (optional)
        c.*m = o.get_optional<Inner>(name);
      else
        c.*m = o.get<T>(name);
    });
  }

  template <class T>
  BoundOption<Config, T> add_step(const std::string& name, OptionSpec* spec, T Config::*member, bool reads_null,
                                  std::function<void(Config&, const Options&)> read) {
    steps_.push_back({name, std::move(read), nullptr, reads_null});
    return BoundOption<Config, T>(this, spec, steps_.size() - 1, member);
  }

  OptionSchema schema_;
  std::vector<Step> steps_;
};

}  // namespace loom
