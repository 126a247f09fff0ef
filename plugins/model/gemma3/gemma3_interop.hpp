// The gemma3 model's Hugging Face mapping (transformers' Gemma3ForCausalLM, model_type
// "gemma3_text"): config.json both ways and the tensors' names. Free functions of the model's
// options, so that the model file is the graph and the mapping is tested on its own.
#pragma once

#include <cstdint>
#include <loom/hf_architecture.hpp>
#include <loom/hf_interop.hpp>
#include <loom/model_support.hpp>
#include <loom/value.hpp>
#include <string>
#include <vector>

#include "gemma3_options.hpp"

namespace loom::gemma3 {

// The transformers model_type values the plugin reads, and how messages name them.
inline const std::vector<std::string> hf_model_types = {"gemma3_text"};
inline constexpr const char* hf_family = "Gemma 3 (text)";

// The config.json of a built model of `vocab` tokens.
Value hf_config(const ModelOptions& o, std::int64_t vocab);

// Compares config.json (everything but model_type) with the model's options: one line per
// difference in `check`. An absent field takes Gemma3TextConfig's default (transformers 4.50).
void check_hf_config(HfConfigCheck& check, const Value& config, const ModelOptions& o, std::int64_t vocab);

// Where each parameter of `store` goes: Llama's layout (base_model_prefix "model", the fused
// qkv_proj split into q_proj, k_proj and v_proj), the tied lm_head skipped.
HfTensorLayout hf_tensors(const models::ParameterStore& store, const ModelOptions& o, std::int64_t vocab);

// The loom model section ({type: gemma3, ...}) that describes the model of a config.json
// (parsed), so that a Hugging Face directory needs no loom config (`loom eval HF_DIR`). Absent
// fields take Gemma3TextConfig's defaults, the ones check_hf_config assumes, so that the model
// built from the section finds no mismatch with the file. A field of the wrong type, or a value
// loom's gemma3 does not compute (a RoPE scaling other than linear, attention biases, another
// activation, layer_types that follow no pattern), is a UserError naming `file` and the field.
Value model_section(const Value& config, const std::string& file);

// The plugin's claim (Registrar::add_hf_architectures, hf_architecture.hpp): model_type
// "gemma3_text" is the gemma3 model, described by model_section. `loom eval HF_DIR` of a Gemma 3
// directory needs no config through it.
HfArchitectures hf_architectures();
// Its tokenizer class, GemmaTokenizer, for those model_types (Registrar::add_hf_tokenizer_class):
// `loom eval HF_DIR` puts its BOS, <bos>, before an empty context where the directory names none.
HfTokenizerClass hf_tokenizer_class();

// Each layer's attention window (0: global) as config.json describes them: layer_types when
// present, else sliding_window_pattern; sliding layers take sliding_window (null: global).
// Throws UserError for a malformed layer_types.
std::vector<std::int64_t> hf_layer_windows(const Value& config, const std::string& file);

}  // namespace loom::gemma3
