#include "loom/core/runtime.hpp"

#include "loom/core/config.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom {

const OptionSchema& plugins_section_schema() {
  static const OptionSchema schema = [] {
    OptionSchema plugins;
    plugins.list("paths", OptionType::string, {},
                 "Plugin directories or files searched after --plugin-path and before LOOM_PLUGIN_PATH; relative "
                 "paths are relative to the config file that names them.");
    return plugins;
  }();
  return schema;
}

namespace {

// Validation of sections that name no component (used before plugins are loaded).
class NoComponents final : public config::ComponentCatalog {
 public:
  const OptionSchema& component_schema(std::string_view kind, std::string_view, std::string_view path,
                                       const SourceLocation& where) const override {
    throw InternalError((where.known() ? where.str() + ": " : "") + std::string(path) + ": no " + std::string(kind) +
                        " can be resolved before plugins are loaded");
  }
};

std::vector<PluginSearchPath> config_plugin_paths(const Value& config) {
  std::vector<PluginSearchPath> out;
  const Value* plugins = config.find("plugins");
  if (!plugins) return out;
  const Value section = config::validate(plugins_section_schema(), *plugins, "plugins", NoComponents());
  const Value* given = plugins->is_map() ? plugins->find("paths") : nullptr;
  if (!given) return out;
  (void)section;
  for (const auto& p : given->as_list()) {
    fs::path path(p.as_string());
    const SourceLocation& loc = p.location();
    // Relative to the config file that names it; command-line values are relative to the cwd.
    if (path.is_relative() && loc.line > 0) path = fs::path(loc.file).parent_path() / path;
    out.push_back({path.lexically_normal(), "plugins.paths" + (loc.known() ? " at " + loc.str() : std::string())});
  }
  return out;
}

}  // namespace

Runtime::Runtime(const RuntimeOptions& options) {
  if (options.config) {
    raw_config_ = config::load(*options.config, options.overrides, &dropped_options_, options.sections);
  } else {
    for (const auto& text : options.overrides)
      config::apply_override(raw_config_, config::parse_override(text), &dropped_options_, options.sections);
  }
  std::vector<PluginSearchPath> command_line;
  for (const auto& p : options.plugin_paths) command_line.push_back({p, "--plugin-path"});
  host_.load(options.default_plugin_path
                 ? PluginHost::default_search_path(command_line, config_plugin_paths(raw_config_))
                 : command_line,
             registry_);
}

Value Runtime::resolved_config(const OptionSchema& sections) const {
  const std::string what = raw_config_.location().known() ? "while validating " + raw_config_.location().file
                                                          : std::string("while validating the config");
  return with_context(what, [&] { return config::validate(sections, raw_config_, "", registry_); });
}

}  // namespace loom
