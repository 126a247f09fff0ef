// The kinds of component a plugin can provide.
#pragma once

#include <array>
#include <string_view>

namespace loom {

struct KindInfo {
  std::string_view name;
  std::string_view description;
};

// In the order `loom plugins` lists them.
inline constexpr std::array<KindInfo, 10> component_kinds{{
    {"backend", "implements the tensor operations (cpu, reference)"},
    {"model", "a transformer architecture built from the backend's operations"},
    {"attention", "an attention kernel: forward and backward"},
    {"optimizer", "updates parameters from gradients"},
    {"dataset", "yields batches of token sequences, indexed by step"},
    {"tokenizer", "maps text to token ids and back"},
    {"lr_schedule", "the learning rate as a function of the step"},
    {"tracker", "records metrics of a run"},
    {"collective", "communication between the processes of a data-parallel run"},
    {"objective", "what training minimises: the loss of a micro-batch (causal_lm, dpo)"},
}};

inline constexpr bool is_component_kind(std::string_view kind) {
  for (const auto& k : component_kinds)
    if (k.name == kind) return true;
  return false;
}

}  // namespace loom
