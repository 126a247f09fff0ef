// Parameter-efficient fine-tuning: low-rank adapters (LoRA, Hu et al. 2021) on any model, and
// freezing parameters by name (docs/fine-tuning.md).
//
// The model plugin takes no part. The weights a model multiplies in Ops::linear are found by
// running its loss once over a few tokens with an observer on the Ops (Ops::set_linear_observer);
// those whose names match lora.target_modules get an adapter (A [rank, in], B [out, rank]), and
// the Ops of every step carries the table of adapters (Ops::set_linear_adapters), so linear adds
// alpha / rank * dropout(x) A^T B^T to each adapted product. A pattern names a weight by loom's
// name or by a Hugging Face (PEFT) module name of the model's layout: on a llama, "q_proj" adapts
// the query rows of the fused qkv_proj with an adapter of its own (PEFT's q_proj adapter), and
// "lm_head" an untied output head. The base weights are frozen
// (Parameter::set_requires_grad(false)): no gradient, no gradient buffer, no optimizer state.
//
// Files: a run saves its adapters in PEFT's layout (adapter_model.safetensors and
// adapter_config.json, tensors named after the Hugging Face modules:
// "base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"), which peft.PeftModel loads on
// the base model; checkpoints hold the adapters under loom's names
// ("h.0.attn.c_attn.lora_A.weight") with their optimizer state.
//
// QLoRA: lora.base_dtype (bf16, int8, nf4) stores the frozen base weights in fewer bits
// (LoraAdapters::store_base, Parameter::set_stored); the products read them a panel at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/options.hpp"
#include "loom/quantization.hpp"
#include "loom/value.hpp"

namespace loom {

// The run config's `lora` section.
OptionSchema lora_schema();

struct LoraSettings {
  std::int64_t rank = 0;                    // 0: no adapters
  double alpha = 16.0;                      // the adapters' product is scaled by alpha / rank
  double dropout = 0.0;                     // on the adapters' input
  std::vector<std::string> target_modules;  // name patterns (loom's or PEFT's); empty: every linear weight
  quant::StorageFormat base_dtype = quant::StorageFormat::f32;  // how the frozen base weights are stored
  // int8 and nf4 also for the token embedding and the output head (else they are stored in bf16).
  bool quantize_embeddings = false;
  bool enabled() const { return rank > 0; }
  float scale() const { return static_cast<float>(alpha / static_cast<double>(rank)); }
};

// The `lora` section of a resolved run config (defaults when it is absent).
LoraSettings lora_settings(const Value& run_config);

// What a training run refuses in the `lora` section before it builds anything (UserError): an
// option that only means something with adapters (lora.target_modules, a lora.base_dtype other
// than f32) while lora.rank is 0, which turns LoRA off (a quantized base with no adapters would
// silently train the whole model in float32).
void check_lora_training(const LoraSettings& settings);

// Whether `pattern` names the parameter `name`. A pattern is a glob (`*` any characters, dots
// included; `?` one character) matched against the whole name, against each of its dot-separated
// suffixes, and against both without the name's last part: "c_attn", "attn.c_attn",
// "h.*.attn.c_attn.weight", "*.bias" and "ln_f" all name parameters of GPT-2's layers.
bool parameter_pattern_matches(std::string_view pattern, std::string_view name);

class LoraAdapters {
 public:
  // Finds the weights `model` (built) multiplies in Ops::linear, keeps those the settings'
  // target_modules name (every one its loss multiplies but embedding tables and the output head
  // when there are none), and allocates their adapters on `backend`. A pattern that matches a
  // weight's loom name adapts the whole weight; one that matches only Hugging Face modules of it
  // (the model's HfTensorLayout: q_proj of llama's qkv_proj) gives each such module an adapter of
  // its own on its rows. It runs the model on zeroed weights: initialise (or load) the model
  // afterwards. Throws UserError naming a pattern that matches no such weight (with the names
  // that could be targeted).
  LoraAdapters(Model& model, Backend& backend, const LoraSettings& settings);
  ~LoraAdapters();
  LoraAdapters(const LoraAdapters&) = delete;
  LoraAdapters& operator=(const LoraAdapters&) = delete;

  const LoraSettings& settings() const { return settings_; }
  // A Kaiming-uniform (as PEFT: bound 1 / sqrt(in)) from the initialisation stream of `seed`, B
  // zero: the adapted model starts as the base model.
  void initialize(std::uint64_t seed);
  // A and B of every adapter, in the model's parameter order: the trained parameters.
  std::vector<ModelParameter> parameters() const;
  // For Ops::set_linear_adapters.
  const LinearAdapters& table() const { return table_; }
  // One per adapter: the adapted weight's name ("h.0.attn.c_attn.weight"), with the Hugging Face
  // module of an adapter on some of its rows ("layers.0.self_attn.qkv_proj.weight (q_proj)").
  std::vector<std::string> target_names() const;
  // Whether any adapted weight is [in, out] (GPT-2's Conv1D: PEFT's fan_in_fan_out).
  bool any_in_out() const;

  // Stores the frozen base weights in settings().base_dtype (nothing for f32): every weight the
  // model multiplies whole in a linear layer (adapted or not) and every embedding table
  // (ParameterRole::embedding), once they hold their values (after initialisation and
  // trainer.init_from) and are frozen (select_trainable). Their float32 values are given back
  // to the system (Parameter::set_stored). Returns the bytes of every stored weight (these and
  // those already stored) and of the float32 values they replace.
  std::pair<std::int64_t, std::int64_t> store_base();
  // Whether store_base stores `p` (frozen, and one of the weights above, with a base_dtype other
  // than f32): trainer.init_from may read it straight into the format (StoredWeights).
  bool stores(const Parameter* p) const;
  // The format store_base stores `p` in: lora.base_dtype, but bf16 for the token embedding and
  // the output head of an int8 or nf4 base unless lora.quantize_embeddings (as QLoRA with
  // transformers and bitsandbytes keeps them in 16 bits).
  quant::StorageFormat format_of(const Parameter* p) const;
  // The first row of each Hugging Face tensor `p` is made of, then its rows (llama's qkv_proj:
  // {0, q, q + kv, q + 2 kv}); empty for a parameter that is one tensor. An nf4 base takes each
  // tensor's double-quantization statistics on its own, as bitsandbytes quantizes each.
  std::vector<std::int64_t> part_rows(const Parameter* p) const;
  // Whether store_base stored any weight: then with_merged cannot merge into the base (there is
  // no float32 base to add to) and instead gives every Ops of its body the adapters' table.
  bool base_stored() const { return base_stored_; }

  // Writes adapter_model.safetensors and adapter_config.json into `dir` (created), named after
  // the model's Hugging Face layout (loom::HfModel; UserError when it has none).
  // `base_model` goes into base_model_name_or_path. Returns the files written.
  std::vector<std::string> save_peft(Model& model, const std::filesystem::path& dir,
                                     const std::string& base_model) const;
  // Reads the adapters from `weights`: a PEFT adapter_model.safetensors, or a file holding
  // loom's names (a checkpoint's model.safetensors).
  void load(Model& model, const std::filesystem::path& weights);
  // W += alpha / rank * B A (transposed for an [in, out] weight), for every adapted weight that
  // is not stored (a stored one has no float32 value to add to: add_merged_rows).
  void merge_into_weights(Backend& backend);
  // out (rows [row_begin, row_end) of `weight`, row-major float32, the weight's columns wide)
  // += those rows of alpha / rank * B A (A^T B^T for an [in, out] weight), summed over the
  // adapters of `weight` (none: unchanged). How an export writes the merged value of a stored
  // weight a tensor at a time: its dequantized rows plus this.
  void add_merged_rows(const Parameter& weight, std::int64_t row_begin, std::int64_t row_end, float* out) const;
  // Runs `body` with the adapters merged into the base weights, then puts the base weights back
  // exactly (from copies): evaluation and sampling see the adapted model through any code path.
  // Makes with_merged give its body the adapters' table instead of merging: the base weights are
  // not this process's to write (fully sharded data parallelism keeps them in units).
  void evaluate_through_table() { through_table_ = true; }
  template <class F>
  auto with_merged(Backend& backend, F&& body) {
    if (base_stored_ || through_table_) {
      const LinearAdaptersScope scope(&table_);
      return body();
    }
    keep_base();
    merge_into_weights(backend);
    struct Restore {
      LoraAdapters* self;
      ~Restore() { self->restore_base(); }
    } restore{this};
    return body();
  }

 private:
  void keep_base();
  void restore_base();
  struct Entry;
  std::vector<std::unique_ptr<Entry>> entries_;
  LinearAdapters table_;
  LoraSettings settings_;
  std::vector<Parameter*> storable_;         // the weights store_base may store, in the model's order
  std::set<const Parameter*> vocab_tables_;  // the embedding tables and the output head among them
  std::map<const Parameter*, std::vector<std::int64_t>> part_rows_;  // of the fused weights
  bool base_stored_ = false;
  bool through_table_ = false;
  Backend* backend_;  // whose memory holds the adapters (initialize fills them there)
};

// Applies trainer.trainable and trainer.frozen (and, under LoRA, freezes every base weight) to
// the model's parameters: set_requires_grad on each. Returns the trainable ones, in order.
// Throws UserError naming a pattern that matches no parameter, or when nothing is left to train.
std::vector<ModelParameter> select_trainable(const std::vector<ModelParameter>& parameters,
                                             const std::vector<std::string>& trainable,
                                             const std::vector<std::string>& frozen, bool lora);

struct RunFiles;
// Loads a LoRA run's model (built) for `loom generate` and `loom export`: the base (the model's
// initialisation from trainer.seed, then trainer.init_from, of which trainer.init_from_weights
// picks the weights), then the adapters from `files` (a checkpoint's model.safetensors, with its
// average of them when files.average is set, or the run's adapter_model.safetensors), merged
// when `merge`. With lora.base_dtype other than f32 the base is stored as the run stored it (read
// straight into the format from a Hugging Face init_from): the model is the one the run trained
// and evaluated, and the adapters cannot be merged into it: run it with
// LinearAdaptersScope(&adapters->table()), and export it with add_merged_rows.
std::shared_ptr<LoraAdapters> load_lora_model(Model& model, Backend& backend, const Value& run_config,
                                              const RunFiles& files, bool merge);

}  // namespace loom
