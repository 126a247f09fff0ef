// The config of a run: its top-level sections (plugins, the components, the trainer) and their
// options. The core validates what it is given; this is what `loom` gives it.
#pragma once

#include "loom/core/runtime.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom {

// The top-level sections of a config file and their options.
const OptionSchema& run_config_schema();

// runtime's config validated against run_config_schema() and every component's options, with
// defaults filled in. Throws UserError on any invalid value.
Value resolved_run_config(const Runtime& runtime);

}  // namespace loom
