// A loom process's runtime: the resolved config, the plugins it found, and the registry they
// filled. Every subcommand of `loom` starts here.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loom/core/config.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/value.hpp"

namespace loom {

struct RuntimeOptions {
  std::vector<std::string> plugin_paths;  // --plugin-path, in order
  std::optional<std::filesystem::path> config;
  std::vector<std::string> overrides;  // a.b.c=value
  // When false, only plugin_paths are searched: no config paths, environment, executable-
  // relative or install directory (for reproducible listings and tests).
  bool default_plugin_path = true;
};

// The top-level sections of a config file and their options.
const OptionSchema& run_config_schema();

class Runtime {
 public:
  // Loads the config (if any), then the plugins: command line, `plugins.paths`, environment,
  // executable-relative and install directories.
  explicit Runtime(const RuntimeOptions& options);

  // The merged config (includes and overrides applied), not yet validated.
  const Value& raw_config() const { return raw_config_; }
  // The config validated against run_config_schema() and every component's options, with
  // defaults filled in. Throws UserError on any invalid value.
  Value resolved_config() const;
  // Options of component sections that a later layer dropped by changing their `type`.
  const std::vector<config::DroppedOptions>& dropped_options() const { return dropped_options_; }

  Registry& registry() { return registry_; }
  const Registry& registry() const { return registry_; }
  const PluginHost& plugin_host() const { return host_; }

 private:
  Value raw_config_ = Value::map();
  std::vector<config::DroppedOptions> dropped_options_;
  Registry registry_;
  PluginHost host_;
};

// `loom plugins`: every component by kind, then every plugin that failed or was shadowed.
std::string describe_plugins(const Runtime& runtime);
std::string describe_plugins_json(const Runtime& runtime);

// `loom config schema [KIND[/NAME]]`: the declared options of the config's sections and of
// every registered component (or the selected ones). Throws UserError for an unknown selector.
std::string describe_schema(const Runtime& runtime, const std::string& selector);
std::string describe_schema_json(const Runtime& runtime, const std::string& selector);
// The same as a Markdown reference page (docs/config-reference.md is this output).
std::string describe_schema_markdown(const Runtime& runtime, const std::string& selector);

}  // namespace loom
