// The rendering behind `loom plugins` and `loom config schema`.
#include "loom/run/describe.hpp"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "loom/error.hpp"
#include "loom/kinds.hpp"
#include "loom/run/run_config.hpp"

namespace loom {

// ---- loom plugins ----

namespace {

std::string pad(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

const char* status_name(PluginRecord::Status s) {
  switch (s) {
    case PluginRecord::Status::loaded:
      return "loaded";
    case PluginRecord::Status::failed:
      return "failed";
    case PluginRecord::Status::shadowed:
      return "shadowed";
  }
  return "?";
}

}  // namespace

std::string describe_plugins(const Runtime& runtime) {
  const Registry& registry = runtime.registry();
  std::string out;
  std::size_t name_width = 4, version_width = 7, description_width = 11;
  for (const auto* e : registry.all()) {
    name_width = std::max(name_width, e->decl.name.size());
    version_width = std::max(version_width, e->decl.version.size());
    description_width = std::max(description_width, e->decl.description.size());
  }
  for (const auto& kind : component_kinds) {
    out += std::string(kind.name) + ": " + std::string(kind.description) + "\n";
    const auto entries = registry.list(kind.name);
    if (entries.empty()) out += "  (none)\n";
    for (const auto* e : entries)
      out += "  " + pad(e->decl.name, name_width) + "  " +
             pad(e->decl.version.empty() ? "-" : e->decl.version, version_width) + "  " +
             pad(e->decl.description, description_width) + "  " + e->plugin_file + "\n";
  }
  bool header = false;
  for (const auto& p : runtime.plugin_host().plugins()) {
    if (p.status != PluginRecord::Status::failed) continue;
    if (!header) out += "\nplugins that failed to load:\n";
    header = true;
    out += "  " + p.file + "\n    " + p.reason + "\n";
  }
  header = false;
  for (const auto& p : runtime.plugin_host().plugins()) {
    if (p.status != PluginRecord::Status::shadowed) continue;
    if (!header) out += "\nplugins not loaded because a file of the same name came first:\n";
    header = true;
    out += "  " + p.file + "\n    " + p.reason + "\n";
  }
  out += "\nplugin path:\n";
  for (const auto& d : registry.searched_dirs()) out += "  " + d + "\n";
  return out;
}

std::string describe_plugins_json(const Runtime& runtime) {
  using nlohmann::json;
  json components = json::array();
  for (const auto* e : runtime.registry().all())
    components.push_back({{"kind", e->kind},
                          {"name", e->decl.name},
                          {"description", e->decl.description},
                          {"version", e->decl.version},
                          {"plugin", e->plugin_file}});
  json plugins = json::array();
  for (const auto& p : runtime.plugin_host().plugins())
    plugins.push_back({{"file", p.file},
                       {"origin", p.origin},
                       {"status", status_name(p.status)},
                       {"reason", p.reason},
                       {"sdk_version", p.sdk_version},
                       {"build_tag", p.build_tag},
                       {"isa", p.isa},
                       {"components", p.components}});
  json doc = {{"components", components}, {"plugins", plugins}, {"plugin_path", runtime.registry().searched_dirs()}};
  return doc.dump(2) + "\n";
}

// ---- loom config schema ----

namespace {

nlohmann::json value_json(const Value& v) {
  switch (v.type()) {
    case Value::Type::null:
      return nullptr;
    case Value::Type::boolean:
      return v.as_bool();
    case Value::Type::integer:
      return v.as_int();
    case Value::Type::number:
      return v.as_double();
    case Value::Type::string:
      return v.as_string();
    case Value::Type::list: {
      auto a = nlohmann::json::array();
      for (const auto& e : v.as_list()) a.push_back(value_json(e));
      return a;
    }
    case Value::Type::map: {
      auto o = nlohmann::json::object();
      for (const auto& [k, e] : v.as_map()) o[k] = value_json(e);
      return o;
    }
  }
  return nullptr;
}

nlohmann::json schema_json(const OptionSchema& schema) {
  auto options = nlohmann::json::array();
  for (const auto& o : schema.options()) {
    nlohmann::json j = {{"name", o.name()},
                        {"type", option_type_name(o.type())},
                        {"doc", o.doc()},
                        {"expected", o.expectation()},
                        {"required", o.is_required() && !o.is_nullable()},
                        {"nullable", o.is_nullable()}};
    if (o.type() != OptionType::object) j["default"] = value_json(o.default_value());
    if (o.min_value()) j["min"] = {{"value", *o.min_value()}, {"inclusive", o.min_inclusive()}};
    if (o.max_value()) j["max"] = {{"value", *o.max_value()}, {"inclusive", o.max_inclusive()}};
    if (!o.choices().empty()) j["choices"] = o.choices();
    if (o.type() == OptionType::list) j["element"] = option_type_name(o.element_type());
    if (o.type() == OptionType::component) j["kind"] = o.component_kind();
    if (o.type() == OptionType::object) j["options"] = schema_json(*o.object_schema());
    options.push_back(std::move(j));
  }
  return options;
}

void schema_lines(const OptionSchema& schema, const std::string& prefix, std::string& out) {
  if (schema.empty()) out += "  (no options)\n";
  for (const auto& o : schema.options()) {
    if (o.type() == OptionType::object) {
      out += "  " + prefix + o.name() + ": " + o.doc() + "\n";
      schema_lines(*o.object_schema(), prefix + o.name() + ".", out);
      continue;
    }
    out += "  " + prefix + o.name() + "  " + o.expectation();
    if (!(o.is_required() && !o.is_nullable()))
      out += "; default " + o.default_value().to_flow();
    else
      out += "; required";
    out += "\n      " + o.doc() + "\n";
  }
}

// What a component's section accepts: its own options, after the options its section of the run
// config adds for every component of its kind (the optimizer's learning_rate and max_grad_norm).
OptionSchema section_options(const ComponentEntry& e) {
  for (const auto& o : run_config_schema().options())
    if (o.type() == OptionType::component && o.component_kind() == e.kind && o.section_schema())
      return section_schema(*o.section_schema(), e.decl.options, e.kind + " '" + e.decl.name + "'");
  return e.decl.options;
}

struct Selection {
  bool sections = false;
  std::vector<const ComponentEntry*> components;
};

Selection select(const Registry& registry, const std::string& selector) {
  Selection s;
  if (selector.empty()) {
    s.sections = true;
    s.components = registry.all();
    return s;
  }
  if (selector == "config") {
    s.sections = true;
    return s;
  }
  const auto slash = selector.find('/');
  const std::string kind = selector.substr(0, slash);
  if (!is_component_kind(kind)) {
    std::vector<std::string> kinds{"config"};
    for (const auto& k : component_kinds) kinds.emplace_back(k.name);
    const std::string guess = closest_match(kind, kinds);
    std::string all;
    for (const auto& k : kinds) all += (all.empty() ? "" : ", ") + k;
    throw UserError("unknown kind '" + kind + "'" + (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                    " (kinds: " + all + ")");
  }
  if (slash == std::string::npos) {
    s.components = registry.list(kind);
    return s;
  }
  const std::string name = selector.substr(slash + 1);
  registry.component_schema(kind, name, selector, {});  // throws the full "unknown" message
  s.components.push_back(registry.find(kind, name));
  return s;
}

}  // namespace

std::string describe_schema(const Runtime& runtime, const std::string& selector) {
  const Selection s = select(runtime.registry(), selector);
  std::string out;
  if (s.sections) {
    out += "config sections\n";
    schema_lines(run_config_schema(), "", out);
  }
  for (const auto* e : s.components) {
    if (!out.empty()) out += "\n";
    out += e->kind + "/" + e->decl.name + ": " + e->decl.description + "  (" + e->plugin_file + ")\n";
    schema_lines(section_options(*e), "", out);
  }
  if (out.empty()) out = "no component of that kind is registered\n";
  return out;
}

namespace {

std::string markdown_escape(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else
      out += c;
  }
  return out;
}

void markdown_rows(const OptionSchema& schema, const std::string& prefix, std::string& out) {
  for (const auto& o : schema.options()) {
    if (o.type() == OptionType::object) {
      out += "| `" + prefix + o.name() + "` | map | | " + markdown_escape(o.doc()) + " |\n";
      markdown_rows(*o.object_schema(), prefix + o.name() + ".", out);
      continue;
    }
    const std::string def =
        (o.is_required() && !o.is_nullable()) ? "required" : "`" + o.default_value().to_flow() + "`";
    out += "| `" + prefix + o.name() + "` | " + markdown_escape(o.expectation()) + " | " + markdown_escape(def) +
           " | " + markdown_escape(o.doc()) + " |\n";
  }
}

void markdown_table(const OptionSchema& schema, std::string& out) {
  if (schema.empty()) {
    out += "No options.\n";
    return;
  }
  out += "| option | accepts | default | description |\n| --- | --- | --- | --- |\n";
  markdown_rows(schema, "", out);
}

}  // namespace

std::string describe_schema_markdown(const Runtime& runtime, const std::string& selector) {
  const Selection s = select(runtime.registry(), selector);
  std::string out =
      "# Config reference\n\nGenerated by `loom config schema --markdown` from the options each component declares; "
      "do not edit by hand (regenerate with `scripts/update-config-reference.sh`). See [config.md](config.md) for "
      "how config files work.\n";
  if (s.sections) {
    out += "\n## Top-level sections\n\n";
    markdown_table(run_config_schema(), out);
  }
  std::string kind;
  for (const auto* e : s.components) {
    if (e->kind != kind) {
      kind = e->kind;
      out += "\n## " + kind + "\n";
    }
    out += "\n### " + kind + "/" + e->decl.name + "\n\n" + e->decl.description + " (plugin `" +
           std::filesystem::path(e->plugin_file).filename().string() + "`, version " + e->decl.version + ")\n\n";
    markdown_table(section_options(*e), out);
  }
  return out;
}

std::string describe_schema_json(const Runtime& runtime, const std::string& selector) {
  const Selection s = select(runtime.registry(), selector);
  nlohmann::json doc = nlohmann::json::object();
  if (s.sections) doc["sections"] = schema_json(run_config_schema());
  auto components = nlohmann::json::array();
  for (const auto* e : s.components)
    components.push_back({{"kind", e->kind},
                          {"name", e->decl.name},
                          {"description", e->decl.description},
                          {"version", e->decl.version},
                          {"plugin", e->plugin_file},
                          {"options", schema_json(section_options(*e))}});
  doc["components"] = components;
  return doc.dump(2) + "\n";
}

}  // namespace loom
