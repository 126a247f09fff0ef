// Reading config files: YAML to loom::Value with locations, base_config, !include, overrides.
#include <yaml-cpp/yaml.h>

#include <charconv>
#include <fstream>
#include <regex>
#include <sstream>

#include "loom/core/config.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::config {

namespace {

bool is_null_word(const std::string& s) {
  return s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL";
}

// A plain (unquoted) scalar typed by the YAML 1.2 core schema.
Value typed_scalar(const std::string& s) {
  if (is_null_word(s)) return Value();
  if (s == "true" || s == "True" || s == "TRUE") return Value(true);
  if (s == "false" || s == "False" || s == "FALSE") return Value(false);
  static const std::regex int_re("[-+]?[0-9]+");
  static const std::regex hex_re("0x[0-9a-fA-F]+");
  static const std::regex oct_re("0o[0-7]+");
  static const std::regex float_re("[-+]?(\\.[0-9]+|[0-9]+(\\.[0-9]*)?)([eE][-+]?[0-9]+)?");
  auto parse_int = [&](std::string_view text, int base) -> std::optional<Value> {
    std::int64_t v = 0;
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v, base);
    if (ec != std::errc() || p != text.data() + text.size()) return std::nullopt;
    return Value(v);
  };
  if (std::regex_match(s, int_re)) {
    if (auto v = parse_int(s, 10)) return *v;
    return Value(std::stod(s));  // too large for 64 bits: a float, as YAML readers do
  }
  if (std::regex_match(s, hex_re))
    if (auto v = parse_int(std::string_view(s).substr(2), 16)) return *v;
  if (std::regex_match(s, oct_re))
    if (auto v = parse_int(std::string_view(s).substr(2), 8)) return *v;
  if (std::regex_match(s, float_re)) return Value(std::stod(s));
  if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" || s == "+.INF")
    return Value(std::numeric_limits<double>::infinity());
  if (s == "-.inf" || s == "-.Inf" || s == "-.INF") return Value(-std::numeric_limits<double>::infinity());
  if (s == ".nan" || s == ".NaN" || s == ".NAN") return Value(std::numeric_limits<double>::quiet_NaN());
  return Value(s);
}

std::string join(const std::string& parent, const std::string& key) {
  return parent.empty() ? key : parent + "." + key;
}

class Loader {
 public:
  Loader(std::vector<DroppedOptions>* dropped, const OptionSchema* sections) : dropped_(dropped), sections_(sections) {}

  Value load_file(const fs::path& file, const SourceLocation& from) {
    std::error_code ec;
    if (!fs::exists(file, ec)) {
      std::string where = from.known() ? from.str() + ": " : "";
      throw UserError(where + "config file '" + file.string() + "' does not exist");
    }
    if (fs::is_directory(file, ec))
      throw UserError((from.known() ? from.str() + ": " : "") + "config path '" + file.string() +
                      "' is a directory, not a YAML file");
    std::ifstream in(file);
    if (!in)
      throw UserError((from.known() ? from.str() + ": " : "") + "cannot read config file '" + file.string() + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    return load_text(ss.str(), file);
  }

  Value load_text(const std::string& text, const fs::path& file) {
    const fs::path canonical = fs::weakly_canonical(fs::absolute(file));
    for (std::size_t i = 0; i < stack_.size(); ++i) {
      if (stack_[i].first == canonical) {
        std::string chain;
        for (std::size_t j = i; j < stack_.size(); ++j) chain += stack_[j].second + " -> ";
        throw UserError("include cycle: " + chain + file.string());
      }
    }
    stack_.emplace_back(canonical, file.string());
    struct Pop {
      std::vector<std::pair<fs::path, std::string>>& s;
      ~Pop() { s.pop_back(); }
    } pop{stack_};

    YAML::Node root;
    try {
      root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      SourceLocation at{file.string(), e.mark.line + 1, e.mark.column + 1};
      throw UserError(at.str() + ": invalid YAML: " + e.msg);
    }
    Value v = convert(root, file, "");
    if (v.is_map()) v = resolve_base_config(std::move(v), file);
    return v;
  }

 private:
  SourceLocation at(const YAML::Node& n, const fs::path& file) const {
    const YAML::Mark m = n.Mark();
    return SourceLocation{file.string(), m.is_null() ? 0 : m.line + 1, m.is_null() ? 0 : m.column + 1};
  }

  // `path` is the node's key path in its file, so that notes about an included file's layers
  // name the section it lands in.
  Value convert(const YAML::Node& n, const fs::path& file, const std::string& path) {
    const SourceLocation loc = at(n, file);
    if (n.Tag() == "!include") {
      if (!n.IsScalar()) throw UserError(loc.str() + ": !include takes a file path");
      const fs::path target = file.parent_path() / n.Scalar();
      const std::string outer = prefix_;
      prefix_ = join(prefix_, path);
      struct Restore {
        std::string& prefix;
        std::string saved;
        ~Restore() { prefix = saved; }
      } restore{prefix_, outer};
      return with_context("while including '" + n.Scalar() + "' at " + loc.str(),
                          [&] { return load_file(target.lexically_normal(), loc); });
    }
    if (!n.Tag().empty() && n.Tag() != "?" && n.Tag() != "!" && n.Tag().rfind("tag:yaml.org,2002:", 0) != 0)
      throw UserError(loc.str() + ": unknown tag '" + n.Tag() + "' (loom knows !include)");
    Value v;
    switch (n.Type()) {
      case YAML::NodeType::Undefined:
      case YAML::NodeType::Null:
        v = Value();
        break;
      case YAML::NodeType::Scalar:
        v = n.Tag() == "!" ? Value(n.Scalar()) : typed_scalar(n.Scalar());
        break;
      case YAML::NodeType::Sequence: {
        Value::List items;
        for (const auto& item : n) items.push_back(convert(item, file, path));
        v = Value(std::move(items));
        break;
      }
      case YAML::NodeType::Map: {
        v = Value::map();
        for (const auto& kv : n) {
          const SourceLocation key_loc = at(kv.first, file);
          if (!kv.first.IsScalar()) throw UserError(key_loc.str() + ": map keys must be plain strings");
          const std::string& key = kv.first.Scalar();
          if (v.find(key)) throw UserError(key_loc.str() + ": duplicate key '" + key + "'");
          Value item = convert(kv.second, file, join(path, key));
          // A null value's location is its key's.
          if (!item.location().known() || kv.second.IsNull()) item.set_location(key_loc);
          v.set(key, std::move(item));
        }
        break;
      }
    }
    if (!v.location().known()) v.set_location(loc);
    return v;
  }

  Value resolve_base_config(Value v, const fs::path& file) {
    const Value* base = v.find("base_config");
    if (!base) return v;
    std::vector<const Value*> bases;
    if (base->is_string()) {
      bases.push_back(base);
    } else if (base->is_list()) {
      for (const auto& b : base->as_list()) {
        if (!b.is_string())
          throw UserError(b.location().str() + ": base_config entries must be file paths, got " + b.describe());
        bases.push_back(&b);
      }
    } else {
      throw UserError(base->location().str() + ": base_config must be a file path or a list of them, got " +
                      base->describe());
    }
    Value merged = Value::map();
    for (const Value* b : bases) {
      const fs::path target = (file.parent_path() / b->as_string()).lexically_normal();
      Value loaded = with_context("while loading base_config '" + b->as_string() + "' at " + b->location().str(),
                                  [&] { return load_file(target, b->location()); });
      if (!loaded.is_map() && !loaded.is_null())
        throw UserError(b->location().str() + ": base config '" + target.string() + "' must be a map, got " +
                        loaded.describe());
      if (loaded.is_map()) merge(merged, loaded, target.string(), dropped_, prefix_, sections_);
    }
    v.erase("base_config");
    merge(merged, v, file.string(), dropped_, prefix_, sections_);
    merged.set_location(v.location());
    return merged;
  }

  std::vector<std::pair<fs::path, std::string>> stack_;  // canonical, as written
  std::vector<DroppedOptions>* dropped_;
  const OptionSchema* sections_;
  std::string prefix_;  // the key path at which the file being loaded is included
};

// The type a component section names: its `type` when it is a map with a string one. (A bare
// name is one too, but only where a map meets it is a string known to be a component's name.)
const Value* type_of(const Value& v) {
  if (v.is_map()) {
    const Value* t = v.find("type");
    return t && t->is_string() ? t : nullptr;
  }
  return nullptr;
}

void record(std::vector<DroppedOptions>* dropped, const std::string& path, const Value& old_section,
            const std::string& old_type, const std::string& new_type, const Value* kept, const std::string& layer) {
  if (!dropped) return;
  DroppedOptions d{path, old_type, new_type, layer, {}};
  for (const auto& [k, v] : old_section.as_map()) {
    if (k == "type" || (kept && kept->find(k))) continue;
    d.keys.push_back(k + (v.location().known() ? " (" + v.location().str() + ")" : ""));
  }
  if (!d.keys.empty()) dropped->push_back(std::move(d));
}

// The options `sections` declares for the whole component section at `path` (OptionSpec::
// section_options: `optimizer.learning_rate`), or null. Only sections reached through plain maps
// are known: a component's own options are the plugin's, unknown while loading.
const OptionSchema* section_options_at(const OptionSchema* sections, const std::string& path) {
  if (!sections || path.empty()) return nullptr;
  const OptionSchema* schema = sections;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const OptionSpec* spec = schema->find(std::string_view(path).substr(start, dot - start));
    if (!spec) return nullptr;
    if (dot == std::string::npos) return spec->type() == OptionType::component ? spec->section_schema().get() : nullptr;
    if (spec->type() != OptionType::object) return nullptr;
    schema = spec->object_schema().get();
    start = dot + 1;
  }
}

// The section that a layer starting afresh with type `fresh` (a map with `type`) makes: the
// layer's options, and the section-wide ones earlier layers gave, which belong to no type.
Value carry_section_options(const Value& old_section, Value fresh, const OptionSchema* section) {
  if (!section) return fresh;
  for (const auto& [k, v] : old_section.as_map())
    if (k != "type" && section->find(k) && !fresh.find(k)) fresh.set(k, v);
  return fresh;
}

// {type: name} for a bare name, located where the name was written.
Value expand_bare_name(const Value& name) {
  Value m = Value::map();
  m.set_location(name.location());
  m.set("type", name);
  return m;
}

bool valid_key(std::string_view k) {
  if (k.empty()) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
  return true;
}

}  // namespace

std::string DroppedOptions::str() const {
  std::string keys_text;
  for (const auto& k : keys) keys_text += (keys_text.empty() ? "" : ", ") + k;
  return (path.empty() ? std::string("the top level") : path) + ": " + layer + " changed the type from '" + old_type +
         "' to '" + new_type + "', so the options earlier layers gave '" + old_type + "' were dropped: " + keys_text;
}

Value load_file(const fs::path& file, std::vector<DroppedOptions>* dropped, const OptionSchema* sections) {
  Loader loader(dropped, sections);
  return loader.load_file(file, {});
}

Value load_string(std::string_view text, const fs::path& file_for_locations, std::vector<DroppedOptions>* dropped,
                  const OptionSchema* sections) {
  Loader loader(dropped, sections);
  return loader.load_text(std::string(text), file_for_locations);
}

void merge(Value& base, const Value& over, const std::string& layer, std::vector<DroppedOptions>* dropped,
           const std::string& path, const OptionSchema* sections) {
  // Options merged onto a bare component name extend it.
  if (over.is_map() && base.is_string() && !over.as_map().empty()) base = expand_bare_name(base);
  if (base.is_map() && over.is_map()) {
    const Value* old_type = type_of(base);
    const Value* new_type = type_of(over);
    // `data: {mixture: ...}`, the run layer's mixture of datasets (docs/datasets.md), replaces a
    // dataset's section, and a dataset's `type` replaces a mixture, as a change of type does.
    if (path == "data" && ((old_type && over.find("mixture")) || (new_type && base.find("mixture")))) {
      record(dropped, path, base, old_type ? old_type->as_string() : "mixture",
             new_type ? new_type->as_string() : "mixture", &over, layer);
      base = over;
      return;
    }
    if (old_type && new_type && old_type->as_string() != new_type->as_string()) {
      Value fresh = carry_section_options(base, over, section_options_at(sections, path));
      record(dropped, path, base, old_type->as_string(), new_type->as_string(), &fresh, layer);
      base = std::move(fresh);
      return;
    }
    for (const auto& [k, v] : over.as_map()) {
      Value* existing = base.find(k);
      if (existing)
        merge(*existing, v, layer, dropped, join(path, k), sections);
      else
        base.set(k, v);
    }
    return;
  }
  // A bare name over a component section: the same type keeps its options, another drops them.
  if (over.is_string()) {
    if (const Value* old_type = type_of(base)) {
      if (old_type->as_string() == over.as_string()) {
        base.set("type", over);
        return;
      }
      Value fresh = carry_section_options(base, expand_bare_name(over), section_options_at(sections, path));
      record(dropped, path, base, old_type->as_string(), over.as_string(), &fresh, layer);
      // Nothing carried over: the bare name stays as written.
      base = fresh.as_map().size() > 1 ? std::move(fresh) : over;
      return;
    }
  }
  base = over;
}

Override parse_override(std::string_view text) {
  const auto eq = text.find('=');
  const std::string shown(text);
  if (eq == std::string_view::npos || eq == 0)
    throw UserError("override '" + shown +
                    "' is not of the form key.path=value (for example optimizer.learning_rate=3e-4)");
  Override o;
  o.text = shown;
  std::string_view key = text.substr(0, eq);
  while (!key.empty()) {
    auto dot = key.find('.');
    std::string_view part = key.substr(0, dot);
    if (!valid_key(part))
      throw UserError("override '" + shown + "': '" + std::string(text.substr(0, eq)) +
                      "' is not a key path (dot-separated names of letters, digits, '_' and '-')");
    o.path.emplace_back(part);
    key = dot == std::string_view::npos ? std::string_view{} : key.substr(dot + 1);
    if (dot != std::string_view::npos && key.empty())
      throw UserError("override '" + shown + "': the key path ends with '.'");
  }
  const SourceLocation loc{"command-line override '" + shown + "'", 0, 0};
  const std::string value_text(text.substr(eq + 1));
  try {
    Value v = load_string(value_text, "<override>");
    // Locations inside the value point at the override, not at a file.
    struct Relocate {
      const SourceLocation& loc;
      void operator()(Value& x) const {
        x.set_location(loc);
        if (x.is_list())
          for (auto& e : x.as_list()) (*this)(e);
        if (x.is_map())
          for (auto& [k, e] : x.as_map()) (*this)(e);
      }
    };
    Relocate{loc}(v);
    o.value = std::move(v);
  } catch (const UserError& e) {
    throw UserError(loc.str() + ": the value is not valid YAML (" + e.message() + ")");
  }
  return o;
}

void apply_override(Value& root, const Override& o, std::vector<DroppedOptions>* dropped,
                    const OptionSchema* sections) {
  if (root.is_null()) root = Value::map();
  const std::string layer = "command-line override '" + o.text + "'";
  Value* node = &root;
  std::string path;
  for (std::size_t i = 0; i + 1 < o.path.size(); ++i) {
    Value* next = node->find(o.path[i]);
    if (!next) {
      Value m = Value::map();
      m.set_location({layer, 0, 0});
      next = &node->set(o.path[i], std::move(m));
    } else if (next->is_null()) {
      *next = Value::map();
    } else if (next->is_string()) {
      *next = expand_bare_name(*next);  // model.attention.block_size=64 on `attention: flash`
    } else if (!next->is_map()) {
      std::string prefix;
      for (std::size_t j = 0; j <= i; ++j) prefix += (j ? "." : "") + o.path[j];
      throw UserError("command-line override '" + o.text + "': '" + prefix + "' is " + next->describe() +
                      (next->location().known() ? " (set at " + next->location().str() + ")" : "") +
                      ", not a map, so it has no key '" + o.path[i + 1] + "'");
    }
    node = next;
    path = join(path, o.path[i]);
  }
  // The override is a layer holding one key of `node`: merged like a file's, so that a map
  // merges and a changed `type` drops the section's earlier options.
  Value layer_value = Value::map();
  layer_value.set_location({layer, 0, 0});
  layer_value.set(o.path.back(), o.value);
  merge(*node, layer_value, layer, dropped, path, sections);
}

Value load(const fs::path& file, const std::vector<std::string>& overrides, std::vector<DroppedOptions>* dropped,
           const OptionSchema* sections) {
  Value root = with_context("while loading " + file.string(), [&] { return load_file(file, dropped, sections); });
  if (root.is_null()) root = Value::map();
  if (!root.is_map())
    throw UserError(root.location().str() + ": a config file must be a map of sections, got " + root.describe());
  for (const auto& text : overrides) apply_override(root, parse_override(text), dropped, sections);
  return root;
}

}  // namespace loom::config
