// Weights in and out in the Hugging Face layout (docs/checkpoints.md).
//
//   export_hf            `loom export RUN_DIR_OR_CHECKPOINT --format hf OUT_DIR`: config.json,
//                        model.safetensors (or shards and model.safetensors.index.json above
//                        max_shard_bytes) and the tokenizer's files, which transformers'
//                        AutoModelForCausalLM / AutoTokenizer .from_pretrained(OUT_DIR) load.
//   load_initial_weights trainer.init_from: a loom checkpoint, a loom model.safetensors or a
//                        Hugging Face model directory, into a built model.
//
// The model plugin supplies the mapping (loom::HfModel, sdk/include/loom/hf_interop.hpp); these
// functions own the files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "loom/kinds/model.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/quantization.hpp"

namespace loom {

class Registry;  // loom/core/registry.hpp

struct HfExportOptions {
  // Shards of at most this many bytes (a tensor larger than it gets a shard of its own); one
  // model.safetensors when everything fits. transformers' save_pretrained default: 5 GB.
  std::uint64_t max_shard_bytes = 5'000'000'000;
  // The weights' dtype in the files: f32, or bf16 (rounded to nearest even; `loom export --dtype`).
  DType dtype = DType::f32;
  // A parameter stored in fewer bits (Parameter::stored(), lora.base_dtype) is written as its
  // dequantized rows, one tensor at a time; this (when set) adds to rows [begin, end) of such a
  // weight, row-major float32, before they are written: a LoRA run's adapters
  // (LoraAdapters::add_merged_rows).
  std::function<void(const Parameter& weight, std::int64_t begin, std::int64_t end, float* rows)> add_to_stored;
  // The Hugging Face directory the run started from (trainer.init_from), if any: config.json
  // takes its token ids (bos_token_id, eos_token_id, pad_token_id), and its
  // max_position_embeddings where that is larger than the model's (a run trains at a shorter
  // model.seq_len than its rotary positions reach).
  std::filesystem::path base_dir;
};

struct HfExportResult {
  std::vector<std::string> files;  // written into the directory, in order
  std::int64_t tensors = 0;
  std::uint64_t weight_bytes = 0;
  std::int64_t shards = 0;     // 1: a single model.safetensors
  std::string tokenizer_note;  // why no tokenizer files were written, or ""
};

// Writes `model` (built, with its weights) and, when it has a Hugging Face form, `tokenizer`
// into `out_dir`, which must not exist or be empty. Throws UserError when the model has no
// Hugging Face mapping or an option has no Hugging Face equivalent.
HfExportResult export_hf(Model& model, const Tokenizer* tokenizer, const std::filesystem::path& out_dir,
                         const HfExportOptions& options = {});

// "5GB", "200MB", "64KiB", "1000" (bytes): decimal units as transformers' max_shard_size reads
// them (KB = 1000 bytes), binary ones with an i (KiB = 1024). Throws UserError naming `what`.
std::uint64_t parse_byte_size(std::string_view text, std::string_view what);

// Frozen weights read straight into a storage format (lora.base_dtype; import_hf).
struct StoredWeights {
  quant::StorageFormat format = quant::StorageFormat::f32;
  // Which parameters (frozen [rows, cols] matrices whose float32 values are never needed).
  std::function<bool(const Parameter*)> stores;
  // The format of each (LoraAdapters::format_of); unset: `format` for all. A fused weight read
  // from several tensors takes each tensor's nf4 statistics on its own.
  std::function<quant::StorageFormat(const Parameter*)> format_of;
};

// The bytes each tensor of a Hugging Face model directory's safetensors files takes in them
// (their headers only are read): what import_hf holds in flight while it stores one.
std::vector<std::int64_t> hf_tensor_bytes(const std::filesystem::path& dir);

// Whether `dir` is a Hugging Face model directory (it holds config.json).
bool is_hf_model_dir(const std::filesystem::path& dir);

// The loom config sections that describe a Hugging Face model directory, for `loom eval HF_DIR`
// without a config: `model` from config.json by the mapping of the plugin in `registry` that
// claims its model_type (Registrar::add_hf_architectures; gpt2 -> gpt2; llama, mistral, qwen2,
// qwen3, mixtral -> llama; gemma2 -> gemma among loom's own), absent fields taking transformers'
// defaults; `tokenizer` from its files (a byte-level BPE tokenizer.json or vocab.json with
// merges.txt -> gpt2-bpe, with tokenizer_config.json's eos_token as its end of text;
// tokenizer.model -> sentencepiece). One UserError naming what is missing or not read (a
// model_type no plugin claims: the ones they do), and how to give a config instead. The model
// plugin's own check (import_hf) then compares the built model with config.json.
struct HfDirectoryConfig {
  Value model, tokenizer;
};
HfDirectoryConfig describe_hf_model_dir(const Registry& registry, const std::filesystem::path& dir);
// The same as command-line overrides ("model={...}", "tokenizer={...}"), to go before the user's.
std::vector<std::string> hf_model_dir_overrides(const Registry& registry, const std::filesystem::path& dir);

// Reads a Hugging Face model directory (config.json with model.safetensors, or with
// model.safetensors.index.json and its shards) into the built `model`. config.json must fit
// the model (HfModel::hf_config_mismatches) and every parameter must be found with its shape;
// otherwise one UserError lists every mismatch, missing tensor and unexpected tensor, and no
// parameter is changed. Returns note lines: what was read, and the tensors skipped as unused
// buffers (attn.bias, rotary_emb.inv_freq, a tied lm_head).
//
// With `stored` (lora.base_dtype), the parameters stored->stores names go from the files straight
// into stored->format (Parameter::set_stored), a tensor at a time per loading thread: their
// float32 values are never written (their pages are never allocated) and each file's pages are
// given back once read, so the peak is the stored weights plus, per thread, one tensor as the
// file holds it (bf16, or f32) or a fused weight (llama's qkv_proj) assembled in float32.
std::vector<std::string> import_hf(Model& model, const std::filesystem::path& dir,
                                   const StoredWeights* stored = nullptr);

// The Hugging Face model directory that trainer.init_from's `source` means (itself, or the
// directory of a weights file in one), or an empty path when it means a loom run or file.
std::filesystem::path hf_source_dir(const std::filesystem::path& source);

// Which weights of a run trained with trainer.ema_decay: the average of the weights (what its
// evaluations measured and its final model.safetensors holds; the default of `loom export`,
// `loom generate` and trainer.init_from) or the live weights the optimizer updated. A run
// without an average has only the live ones, and either choice takes them, saying so.
enum class WeightsChoice { ema, live };
// "ema" or "live"; a UserError naming `option` otherwise.
WeightsChoice parse_weights_choice(std::string_view text, std::string_view option);

// The files of RUN_DIR_OR_CHECKPOINT (docs/checkpoints.md): a run directory (its
// checkpoints/latest when there is one, else its own final weights), a checkpoints/ directory
// (its latest), a step-<N>/ directory, or a weights file (in its directory).
struct RunFiles {
  std::filesystem::path dir;      // config.yaml and tokenizer.state
  std::filesystem::path weights;  // model.safetensors
  // A checkpoint's optimizer.safetensors whose "ema/<parameter>" entries (the average) replace
  // those parameters' values read from `weights`; empty: `weights` alone.
  std::filesystem::path average;
  // Which weights these are, for the log: "the weight average (trainer.ema_decay) of checkpoint
  // runs/a/checkpoints/step-20", "the live weights of runs/a/model.safetensors (its run kept no
  // weight average)".
  std::string description;
  bool has_average = false;  // whether the source had an average to choose (else: live weights only)
};
// Throws UserError when `path` is none of these, and for WeightsChoice::live where only the
// average was saved (a run's final model.safetensors under trainer.ema_decay, without a
// checkpoint of that step).
RunFiles resolve_run_or_checkpoint(const std::filesystem::path& path, WeightsChoice choice = WeightsChoice::ema);
// The same choice for a weights file already found: `weights` in the run or checkpoint
// directory `dir`.
RunFiles choose_weights(const std::filesystem::path& dir, const std::filesystem::path& weights, WeightsChoice choice);

// Reads files.weights into `parameters` (safetensors::load_parameters: exactly their names and
// shapes), then files.average's "ema/<name>" entries over the parameters they name. Nothing is
// changed unless every check passes.
void load_run_weights(const RunFiles& files, const std::vector<ModelParameter>& parameters);

// trainer.init_from: loads `source` into the built `model`, over its initialisation. `source`
// is a Hugging Face model directory (import_hf; a weights file in one means the directory), a
// loom run, checkpoints/ or step-<N>/ directory, or a loom model.safetensors file (names and
// shapes must match exactly); of a loom run, `choice` picks the weights (trainer.init_from_weights).
// Returns note lines for the run's log.
//
// With `stored`, a Hugging Face source reads those weights straight into their format
// (import_hf); a loom source ignores it (the caller stores them afterwards).
std::vector<std::string> load_initial_weights(Model& model, const std::filesystem::path& source,
                                              WeightsChoice choice = WeightsChoice::ema,
                                              const StoredWeights* stored = nullptr);

}  // namespace loom
