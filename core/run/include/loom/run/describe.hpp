// What `loom plugins` and `loom config schema` print: the registered components and the plugins
// behind them, and the options of the config's sections and of every component, as text, JSON
// or Markdown.
#pragma once

#include <string>

#include "loom/core/runtime.hpp"

namespace loom {

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
