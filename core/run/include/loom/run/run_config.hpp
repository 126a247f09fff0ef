// The config of a run: its top-level sections (plugins, the components, the trainer) and their
// options. The core validates what it is given; this is what `loom` gives it.
#pragma once

#include "loom/core/runtime.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom {

// The top-level sections of a config file and their options.
const OptionSchema& run_config_schema();

// runtime's config validated against run_config_schema() and every component's options, with
// defaults filled in. Throws UserError on any invalid value.
Value resolved_run_config(const Runtime& runtime);

// `model.attention` of a resolved config, against the backend the run computes on
// (docs/attention-kernels.md#auto): `auto`, every model's default, becomes the name of the kernel
// on the backend's device that Registry::attention_kernels_on ranks first; an explicit kernel
// that computes on another device is a UserError naming the kernels that compute there. Called
// after the backend and before the model is created (train, eval, generate); a config without
// `model.attention` is left as it is.
void resolve_attention_kernel(const Registry& registry, Value& config, const Backend& backend);

}  // namespace loom
