// The gemma3 model's options (model: {type: gemma3, ...}), shared by the graph (gemma3_model.cpp),
// the Hugging Face mapping (gemma3_interop.cpp) and the plugin's tests.
#pragma once

#include <cstdint>
#include <loom/decoder_options.hpp>

namespace loom::gemma3 {

// The options every rotary decoder has (decoder_options.hpp), and Gemma 3's own.
struct ModelOptions : models::RotaryDecoderOptions {
  double query_pre_attn_scalar;
  std::int64_t sliding_window_pattern;  // layer l is global when (l + 1) % pattern == 0
  double rope_theta;                    // the global layers' RoPE base
  double rope_local_base_freq;          // the sliding layers' RoPE base
  double rope_scaling_factor;           // linear scaling of the global layers' positions; 0: none
  double final_logit_softcapping;       // 0: off

  // transformers' Gemma3Attention.is_sliding: every layer but each sliding_window_pattern-th
  // (5 of 6 with the default) attends to the last sliding_window positions.
  bool is_sliding(std::int64_t layer) const { return sliding_window > 0 && (layer + 1) % sliding_window_pattern != 0; }
};

// The options' declaration (loom config schema, docs/config-reference.md) and their reading, with
// the checks that need several options at once: each option written once.
models::DecoderSchema<ModelOptions> model_options();

}  // namespace loom::gemma3
