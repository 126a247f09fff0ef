// A loom process's runtime: the merged config, the plugins it found, and the registry they
// filled. Every subcommand of `loom` starts here. What the config's sections mean beyond
// `plugins` is the caller's: the run layer (loom/run/run_config.hpp) declares them.
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
  // The top-level schema the config will be validated against (the run layer's
  // run_config_schema()), when the caller knows it: the options it declares for a whole component
  // section (`optimizer.learning_rate`) survive a layer that changes the section's `type`.
  const OptionSchema* sections = nullptr;
};

// The `plugins` section, which the runtime reads itself to find the plugins before anything is
// validated. A caller's top-level schema includes it (the run layer's run_config_schema() does).
const OptionSchema& plugins_section_schema();

class Runtime {
 public:
  // Loads the config (if any), then the plugins: command line, `plugins.paths`, environment,
  // executable-relative and install directories.
  explicit Runtime(const RuntimeOptions& options);

  // The merged config (includes and overrides applied), not yet validated.
  const Value& raw_config() const { return raw_config_; }
  // The config validated against `sections` (the top-level schema: every section and its
  // options) and every component's options, with defaults filled in. Throws UserError on any
  // invalid value, an unknown section included.
  Value resolved_config(const OptionSchema& sections) const;
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

}  // namespace loom
