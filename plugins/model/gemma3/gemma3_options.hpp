// The gemma3 model's options (model: {type: gemma3, ...}), shared by the graph (gemma3_model.cpp),
// the Hugging Face mapping (gemma3_interop.cpp) and the plugin's tests.
#pragma once

#include <cstdint>
#include <loom/autograd.hpp>
#include <loom/options.hpp>
#include <string>

namespace loom::gemma3 {

struct ModelOptions {
  std::int64_t seq_len = 32768, hidden_dim = 2304, intermediate_dim = 9216, num_layers = 26;
  std::int64_t num_heads = 8, num_kv_heads = 4, head_dim = 256;
  double query_pre_attn_scalar = 256.0;
  std::int64_t sliding_window = 4096;       // 0: every layer global
  std::int64_t sliding_window_pattern = 6;  // layer l is global when (l + 1) % pattern == 0
  double rope_theta = 1e6;                  // the global layers' RoPE base
  double rope_local_base_freq = 1e4;        // the sliding layers' RoPE base
  double rope_scaling_factor = 0.0;         // linear scaling of the global layers' positions; 0: none
  double final_logit_softcapping = 0.0;     // 0: off
  double initializer_range = 0.02, layer_norm_epsilon = 1e-6;
  bool tie_word_embeddings = true;
  std::int64_t vocab_size = 0;  // 0: from the tokenizer
  std::string path = "model";   // where the options sit in the config, for messages
  RematPolicy remat = RematPolicy::none;

  // transformers' Gemma3Attention.is_sliding: every layer but each sliding_window_pattern-th
  // (5 of 6 with the default) attends to the last sliding_window positions.
  bool is_sliding(std::int64_t layer) const { return sliding_window > 0 && (layer + 1) % sliding_window_pattern != 0; }
};

// The options' schema (loom config schema, docs/config-reference.md) and their reading, with the
// checks that need several options at once.
OptionSchema schema();
ModelOptions read_options(const loom::Options& options);

}  // namespace loom::gemma3
