// Hugging Face interop: what a model (and a tokenizer) provides so that `loom export --format hf`
// writes a directory transformers' AutoModelForCausalLM.from_pretrained loads, and
// trainer.init_from starts a run from such a directory.
//
// Both interfaces are optional. A model plugin whose model also derives from loom::HfModel (a
// tokenizer from loom::HfTokenizer) takes part; the services find them with dynamic_cast and
// refuse, naming the component, when a run's model does not. The plugin owns the mapping: the
// Hugging Face names and layouts of its parameters, the config.json fields, which Hugging Face
// architectures it accepts. The services own the files: safetensors, sharding and the index,
// config.json, the tokenizer files.
//
// The way in before any model exists (config.json to a loom `model` section, for `loom eval
// HF_DIR`) is the plugin's claim of the model_types it reads: hf_architecture.hpp.
//
// Methods are called from one thread, after Model::build.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/value.hpp"

namespace loom {

// One tensor of a Hugging Face checkpoint: rows [begin, end) along dimension 0 of the loom
// parameter `parameter` (the whole parameter when the rows are all of them). A fused parameter
// maps to several tensors: llama's qkv_proj to q_proj, k_proj and v_proj.
struct HfTensor {
  std::string name;       // the Hugging Face name: "model.layers.0.self_attn.q_proj.weight"
  std::string parameter;  // the loom parameter: "layers.0.self_attn.qkv_proj.weight"
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

struct HfTensorLayout {
  // transformers' base_model_prefix ("transformer", "model"). Files name tensors with it (what
  // save_pretrained writes, and what loom writes) or without it (older hub files such as
  // OpenAI's GPT-2); both load.
  std::string base_model_prefix;
  // Every parameter's rows exactly once.
  std::vector<HfTensor> tensors;
  // Ends of names a Hugging Face file may hold that the model has no use for: buffers
  // transformers recomputes (GPT-2's causal masks "attn.bias", Llama's "rotary_emb.inv_freq")
  // and, with tied embeddings, "lm_head.weight". They are skipped and named in a note; any
  // other tensor the layout does not name is an error.
  std::vector<std::string> ignored_suffixes;
};

class HfModel {
 public:
  virtual ~HfModel();
  // The config.json of the built model: `model_type`, `architectures` and every field the
  // transformers config class (GPT2Config, LlamaConfig, MistralConfig, ...) needs to rebuild
  // exactly this model. Throws UserError naming the option that has no Hugging Face equivalent.
  virtual Value hf_config() const = 0;
  // Where each parameter goes in a Hugging Face checkpoint.
  virtual HfTensorLayout hf_tensors() const = 0;
  // Compares a Hugging Face config.json (parsed into a Value) with the built model: one line per
  // mismatch, each naming the config.json field, its value and the model option that disagrees
  // ("num_key_value_heads is 2, model.num_kv_heads is 4"); none when the file's weights fit this
  // model and compute the same function. An architecture the plugin does not accept is a
  // mismatch too.
  virtual std::vector<std::string> hf_config_mismatches(const Value& config) const = 0;
};

struct HfFile {
  std::string name;  // "vocab.json"
  std::string content;
};

class HfTokenizer {
 public:
  virtual ~HfTokenizer();
  // The files transformers' AutoTokenizer.from_pretrained reads for this tokenizer (for GPT-2's
  // BPE: vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json, or
  // tokenizer.json). `model_max_length` is the model's context.
  virtual std::vector<HfFile> hf_tokenizer_files(std::int64_t model_max_length) const = 0;
};

// Help for HfModel::hf_config_mismatches: reads config.json fields (taking transformers'
// default when a field is absent, as its config classes do) and collects one line per field
// that disagrees with the model's option:
//   "n_head is 4, model.num_heads is 8"
class HfConfigCheck {
 public:
  // `options_path` is where the model's options live in the run's config ("model").
  HfConfigCheck(const Value& config, std::string options_path) : config_(config), path_(std::move(options_path)) {}

  // The field, or `fallback` when it is absent or null.
  const Value& field(std::string_view key, const Value& fallback) const {
    const Value* v = config_.is_map() ? config_.find(key) : nullptr;
    return v && !v->is_null() ? *v : fallback;
  }
  std::int64_t integer(std::string_view key, std::int64_t fallback) {
    const Value f(fallback);
    const Value& v = field(key, f);
    if (v.is_int()) return v.as_int();
    wrong_type(key, v, "an integer");
    return fallback;
  }
  double number(std::string_view key, double fallback) {
    const Value f(fallback);
    const Value& v = field(key, f);
    if (v.is_number()) return v.as_double();
    wrong_type(key, v, "a number");
    return fallback;
  }
  bool boolean(std::string_view key, bool fallback) {
    const Value f(fallback);
    const Value& v = field(key, f);
    if (v.is_bool()) return v.as_bool();
    wrong_type(key, v, "true or false");
    return fallback;
  }
  std::string string(std::string_view key, const std::string& fallback) {
    const Value f(fallback);
    const Value& v = field(key, f);
    if (v.is_string()) return v.as_string();
    wrong_type(key, v, "a string");
    return fallback;
  }

  // Field `key` (default `fallback`) must equal the model's `option` (under options_path).
  void expect_integer(std::string_view key, std::int64_t fallback, std::int64_t expected, std::string_view option) {
    const std::int64_t got = integer(key, fallback);
    if (got != expected) differ(key, std::to_string(got), option, std::to_string(expected));
  }
  // Numbers agree to a relative 1e-6 (options such as epsilons are kept in single precision).
  void expect_number(std::string_view key, double fallback, double expected, std::string_view option) {
    const double got = number(key, fallback);
    if (std::abs(got - expected) > 1e-6 * std::max(std::abs(got), std::abs(expected)))
      differ(key, Value(got).describe(), option, Value(expected).describe());
  }
  void expect_boolean(std::string_view key, bool fallback, bool expected, std::string_view option) {
    const bool got = boolean(key, fallback);
    if (got != expected) differ(key, got ? "true" : "false", option, expected ? "true" : "false");
  }

  // "KEY is GOT, PATH.OPTION is EXPECTED"
  void differ(std::string_view key, const std::string& got, std::string_view option, const std::string& expected) {
    mismatch(std::string(key) + " is " + got + ", " + path_ + "." + std::string(option) + " is " + expected);
  }
  void mismatch(std::string line) { lines_.push_back(std::move(line)); }
  const std::string& options_path() const { return path_; }
  std::vector<std::string> take() { return std::move(lines_); }

 private:
  void wrong_type(std::string_view key, const Value& v, const char* wanted) {
    mismatch(std::string(key) + " is " + v.describe() + ", expected " + wanted);
  }
  const Value& config_;
  std::string path_;
  std::vector<std::string> lines_;
};

}  // namespace loom
