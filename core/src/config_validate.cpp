// Validation of config nodes against declared options.
#include <cmath>

#include "loom/core/config.hpp"
#include "loom/error.hpp"

namespace loom::config {

namespace {

std::string join_path(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : std::string(parent) + "." + std::string(key);
}

std::string prefix(const SourceLocation& loc) {
  return loc.known() ? loc.str() + ": " : "";
}

// The documented options, one per line, for error messages.
std::string option_listing(const OptionSchema& schema) {
  if (schema.empty()) return "  (it takes no options)";
  std::string out;
  for (const auto& o : schema.options()) {
    out += "  " + o.name() + " (" + std::string(option_type_name(o.type()));
    if (o.is_required())
      out += ", required";
    else
      out += ", default " + o.default_value().to_flow();
    out += "): " + o.doc() + "\n";
  }
  if (!out.empty()) out.pop_back();
  return out;
}

[[noreturn]] void invalid(const Value& v, const std::string& path, const OptionSpec& spec,
                          const std::string& why = "") {
  throw UserError(prefix(v.location()) + path + ": expected " + spec.expectation() + ", got " + v.describe() +
                  (why.empty() ? "" : " (" + why + ")"));
}

void check_range(const Value& v, double x, const std::string& path, const OptionSpec& spec) {
  if (std::isnan(x)) invalid(v, path, spec, "not a number");
  if (spec.min_value() && (spec.min_inclusive() ? x < *spec.min_value() : x <= *spec.min_value()))
    invalid(v, path, spec, "out of range");
  if (spec.max_value() && (spec.max_inclusive() ? x > *spec.max_value() : x >= *spec.max_value()))
    invalid(v, path, spec, "out of range");
}

void check_choice(const Value& v, const std::string& s, const std::string& path, const OptionSpec& spec) {
  if (spec.choices().empty()) return;
  for (const auto& c : spec.choices())
    if (c == s) return;
  std::string guess = closest_match(s, spec.choices());
  invalid(v, path, spec, guess.empty() ? "not an allowed value" : "did you mean '" + guess + "'?");
}

// Validates a scalar of `type` with the spec's bounds and choices; returns it normalised (ints
// as numbers for float options, integral floats as ints for integer options).
Value validate_scalar(OptionType type, const Value& v, const std::string& path, const OptionSpec& spec) {
  switch (type) {
    case OptionType::boolean:
      if (!v.is_bool()) invalid(v, path, spec);
      return v;
    case OptionType::integer: {
      std::int64_t i = 0;
      if (v.is_int()) {
        i = v.as_int();
      } else if (v.is_number() && std::isfinite(v.as_double()) && v.as_double() == std::floor(v.as_double()) &&
                 std::abs(v.as_double()) < 9.0e15) {
        i = static_cast<std::int64_t>(v.as_double());  // 1e6 steps is a fine way to write a count
      } else {
        invalid(v, path, spec);
      }
      check_range(v, static_cast<double>(i), path, spec);
      Value out(i);
      out.set_location(v.location());
      return out;
    }
    case OptionType::number: {
      if (!v.is_number()) invalid(v, path, spec);
      check_range(v, v.as_double(), path, spec);
      Value out(v.as_double());
      out.set_location(v.location());
      return out;
    }
    case OptionType::string:
      if (!v.is_string()) invalid(v, path, spec);
      check_choice(v, v.as_string(), path, spec);
      return v;
    default:
      throw InternalError("validate_scalar: not a scalar type");
  }
}

Value validate_impl(const OptionSchema& schema, const Value& node, const std::string& path, const std::string& owner,
                    const ComponentCatalog& catalog);

// `section`: the options the section holding the component adds to the component's own (see
// OptionSpec::section_options), or null.
Value validate_component_impl(std::string_view kind, const Value& node, const std::string& path,
                              const ComponentCatalog& catalog, const Value& default_name, const OptionSchema* section) {
  std::string name;
  const Value* type_value = nullptr;
  Value options = Value::map();
  options.set_location(node.location());
  if (node.is_string()) {
    name = node.as_string();
    type_value = &node;
  } else if (node.is_map()) {
    type_value = node.find("type");
    if (type_value) {
      if (!type_value->is_string())
        throw UserError(prefix(type_value->location()) + path + ".type: expected the name of a " + std::string(kind) +
                        ", got " + type_value->describe());
      name = type_value->as_string();
    } else if (default_name.is_string()) {
      name = default_name.as_string();
    } else {
      throw UserError(prefix(node.location()) + path + ": missing `type`: which " + std::string(kind) +
                      " to use (for example `" + path + ": {type: NAME, ...}`)");
    }
    for (const auto& [k, v] : node.as_map())
      if (k != "type") options.set(k, v);
  } else {
    throw UserError(prefix(node.location()) + path + ": expected the name of a " + std::string(kind) +
                    " or a map with `type`, got " + node.describe());
  }
  const SourceLocation where = type_value ? type_value->location() : node.location();
  const OptionSchema& own = catalog.component_schema(kind, name, path, where);
  const OptionSchema merged =
      section ? section_schema(*section, own, path + ": " + std::string(kind) + " '" + name + "'") : OptionSchema();
  const OptionSchema& schema = section ? merged : own;
  Value out = validate_impl(schema, options, path, std::string(kind) + " '" + name + "'", catalog);
  Value typed = Value::map();
  typed.set_location(node.location());
  Value type_name(name);
  type_name.set_location(where);
  typed.set("type", std::move(type_name));
  for (auto& [k, v] : out.as_map()) typed.set(k, std::move(v));
  return typed;
}

Value validate_option(const OptionSpec& spec, const Value& v, const std::string& path,
                      const ComponentCatalog& catalog) {
  if (v.is_null() && spec.type() != OptionType::any) {
    if (spec.is_nullable() || (spec.type() == OptionType::object)) {
      if (spec.type() == OptionType::object) return validate_impl(*spec.object_schema(), v, path, path, catalog);
      return v;
    }
    invalid(v, path, spec);
  }
  switch (spec.type()) {
    case OptionType::boolean:
    case OptionType::integer:
    case OptionType::number:
    case OptionType::string:
      return validate_scalar(spec.type(), v, path, spec);
    case OptionType::list: {
      if (!v.is_list()) invalid(v, path, spec);
      const auto& items = v.as_list();
      if (items.size() < spec.min_length() || items.size() > spec.max_length()) invalid(v, path, spec, "wrong length");
      Value::List out;
      for (std::size_t i = 0; i < items.size(); ++i)
        out.push_back(validate_scalar(spec.element_type(), items[i], path + "[" + std::to_string(i) + "]", spec));
      Value list(std::move(out));
      list.set_location(v.location());
      return list;
    }
    case OptionType::object: {
      if (!v.is_map()) invalid(v, path, spec);
      return validate_impl(*spec.object_schema(), v, path, path, catalog);
    }
    case OptionType::component:
      return validate_component_impl(spec.component_kind(), v, path, catalog, spec.default_value(),
                                     spec.section_schema().get());
    case OptionType::any:
      return v;
  }
  return v;
}

Value validate_impl(const OptionSchema& schema, const Value& node, const std::string& path, const std::string& owner,
                    const ComponentCatalog& catalog) {
  if (!node.is_null() && !node.is_map())
    throw UserError(prefix(node.location()) + (path.empty() ? "config" : path) + ": expected a map of options, got " +
                    node.describe());
  // Unknown keys first: a typo is the likeliest mistake, and it explains a "missing" option.
  if (node.is_map()) {
    for (const auto& [key, v] : node.as_map()) {
      if (schema.find(key)) continue;
      const std::string guess = closest_match(key, schema.names());
      throw UserError(prefix(v.location()) + join_path(path, key) + ": unknown option" +
                      (owner.empty() ? "" : " of " + owner) + (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                      "\nvalid options" + (owner.empty() ? "" : " of " + owner) + ":\n" + option_listing(schema));
    }
  }
  Value out = Value::map();
  out.set_location(node.location());
  for (const auto& spec : schema.options()) {
    const std::string key_path = join_path(path, spec.name());
    const Value* given = node.is_map() ? node.find(spec.name()) : nullptr;
    if (!given) {
      if (spec.is_required() && !(spec.is_nullable() && spec.default_value().is_null()))
        throw UserError(prefix(node.location()) + (path.empty() ? "config" : path) + ": missing required option '" +
                        spec.name() + "' (" + spec.expectation() + "): " + spec.doc());
      if (spec.type() == OptionType::object) {
        out.set(spec.name(), validate_impl(*spec.object_schema(), Value(), key_path, key_path, catalog));
      } else if (spec.type() == OptionType::component && !spec.default_value().is_null()) {
        out.set(spec.name(), validate_component_impl(spec.component_kind(), spec.default_value(), key_path, catalog,
                                                     spec.default_value(), spec.section_schema().get()));
      } else {
        out.set(spec.name(), spec.default_value());
      }
      continue;
    }
    out.set(spec.name(), validate_option(spec, *given, key_path, catalog));
  }
  return out;
}

// The declared defaults, as check_declared_defaults describes. A component option's default is a
// name, resolved (and checked) only where plugins are known; `any` has nothing to check.
class NoCatalog final : public ComponentCatalog {
 public:
  const OptionSchema& component_schema(std::string_view kind, std::string_view, std::string_view path,
                                       const SourceLocation&) const override {
    throw InternalError(std::string(path) + ": a default " + std::string(kind) + " is not resolved here");
  }
};

void check_defaults_impl(const OptionSchema& schema, const std::string& path, const std::string& owner) {
  for (const auto& spec : schema.options()) {
    const std::string key = join_path(path, spec.name());
    if (spec.type() == OptionType::object) {
      check_defaults_impl(*spec.object_schema(), key, owner);
      continue;
    }
    const Value& d = spec.default_value();
    if (d.is_null() || spec.type() == OptionType::component || spec.type() == OptionType::any) continue;
    try {
      validate_option(spec, d, key, NoCatalog());
    } catch (const UserError& e) {
      // e.message() reads "KEY: expected ..., got ... (why)"; the key is named once, in front.
      std::string why = e.message();
      if (why.rfind(key + ": ", 0) == 0) why.erase(0, key.size() + 2);
      const std::string shown = d.is_string() ? "\"" + d.as_string() + "\"" : d.to_flow();
      throw UserError(owner + " declares the option '" + key + "' with the default " + shown +
                      ", which the option itself refuses (" + why +
                      "): the plugin must change the default or the option's range or choices");
    }
  }
}

}  // namespace

void check_declared_defaults(const OptionSchema& schema, std::string_view owner) {
  check_defaults_impl(schema, "", std::string(owner));
}

Value validate(const OptionSchema& schema, const Value& node, std::string_view path, const ComponentCatalog& catalog) {
  return validate_impl(schema, node, std::string(path), std::string(path), catalog);
}

Value validate_component(std::string_view kind, const Value& node, std::string_view path,
                         const ComponentCatalog& catalog) {
  return validate_component_impl(kind, node, std::string(path), catalog, Value(), nullptr);
}

}  // namespace loom::config
