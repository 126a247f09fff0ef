// Text generation from a model, with a KV cache: the prompt runs once, then one forward pass
// per new token over that token alone.
//
// The cache always holds one segment, from position 0: what the model sees while generating is
// always a row the training data could have held (docs/training.md, "Generation"):
//   * An empty prompt starts a document as packed training data does: the document's first
//     token is predicted from the separator that ends the document before it
//     (document_separator: the end-of-text token, or "\n" without one), which belongs to that
//     previous document's segment; the document's own tokens never see it. So the separator runs
//     alone at position 0 (a row that begins at a separator), its logits give the first token,
//     and the cache is then emptied: the document runs from position 0, as a row that begins at
//     a document's first token.
//   * A generated separator that ends documents in the training data (an end-of-text token; a
//     "\n" that occurs only between documents) ends the document: its logits, which see the
//     document as in training, give the next document's first token, and the cache is emptied.
//   * When the cache is full (the model's context), the oldest quarter of the tokens is dropped
//     and the cache is refilled from the rest, positions again from 0: a row that begins
//     mid-document. One forward pass over 3/4 of the context every context/4 new tokens.
//     ContextPolicy::stop stops there instead.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/lora.hpp"

namespace loom {

// What generation does when the sequence fills the model's context.
enum class ContextPolicy {
  slide,  // drop the oldest quarter of the tokens and go on
  stop,   // stop (StopReason::context)
};

struct SamplingOptions {
  std::int64_t max_new_tokens = 200;  // >= 0
  double temperature = 1.0;           // >= 0; 0: greedy
  std::int64_t top_k = 0;             // >= 0; 0: off
  double top_p = 1.0;                 // in (0, 1]; 1: off
  std::uint64_t seed = 0;
  bool stop_at_end_of_text = true;
  ContextPolicy at_context_end = ContextPolicy::slide;
  // Called on every Ops the generation runs the model with, before it does: the trainer's
  // samples under tensor parallelism attach the tensor group (every member of the group then
  // generates the same text). Null: nothing.
  std::function<void(Ops&)> attach;
};

// How the caller names each sampling option, for messages: "--top-k" on the command line,
// "trainer.sample_top_k" in a config.
struct SamplingOptionNames {
  std::string max_new_tokens = "--max-new-tokens";
  std::string temperature = "--temperature";
  std::string top_k = "--top-k";
  std::string top_p = "--top-p";
};

// A UserError naming the option and its valid range when one is out of range.
void check_sampling_options(const SamplingOptions& options, const SamplingOptionNames& names = {});

// Why generation ended.
enum class StopReason {
  length,       // max_new_tokens were generated
  end_of_text,  // the model generated the end-of-text token (stop_at_end_of_text)
  context,      // the context is full (ContextPolicy::stop)
};

// How a run's training data separated documents: what generation starts a document from, and
// whether generating it ends one.
struct DocumentBoundary {
  std::vector<std::int32_t> separator;
  bool separator_ends_documents = false;
};

// The boundary of documents packed for `tokenizer` (document_separator: its end-of-text token,
// or the encoding of "\n"). An end-of-text token always ends a document; "\n" only when
// `separator_ends_documents` (Dataset::separator_ends_documents of the run's data: "\n" never
// occurs inside its documents). A vocabulary that cannot encode "\n" (a `char` tokenizer fitted
// on one document without a line break) never separated documents, so the model never saw a
// document start: token 0 stands in.
DocumentBoundary document_boundary(const Tokenizer& tokenizer, bool separator_ends_documents);

// A sequence in a model's KV cache, growing one token at a time by the rules above. After
// start() and after each append(), logits() are the model's logits for the next token.
class TokenStream {
 public:
  // `attach`: SamplingOptions::attach.
  TokenStream(Model& model, Backend& backend, DocumentBoundary boundary, ContextPolicy policy = ContextPolicy::slide,
              std::function<void(Ops&)> attach = {});
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  // Starts over with `prompt` (the beginning of a document), or with a new document when it is
  // empty. A prompt longer than the context keeps its last tokens.
  void start(std::span<const std::int32_t> prompt);
  // Appends `token`. Returns false, and appends nothing, when the context is full and the policy
  // is ContextPolicy::stop.
  bool append(std::int32_t token);
  // The logits of the next token, [vocab].
  const std::vector<float>& logits() const { return logits_; }
  // The model's context: the most positions the cache holds.
  std::int64_t context() const { return context_; }

 private:
  void run(std::span<const std::int32_t> tokens);
  bool ends_with_separator() const;

  Model& model_;
  Backend& backend_;
  DocumentBoundary boundary_;
  ContextPolicy policy_;
  std::int64_t context_ = 0;
  std::unique_ptr<KvCache> cache_;
  std::vector<std::int32_t> held_;  // the tokens in the cache, from position 0
  bool new_document_ = false;       // the next token starts a document: empty the cache first
  std::vector<float> logits_;
  std::function<void(Ops&)> attach_;
};

struct Generation {
  std::vector<std::int32_t> tokens;  // the new tokens, end-of-text tokens included
  StopReason stop = StopReason::length;
};

// Samples up to max_new_tokens tokens after `prompt` (empty: a new document), calling on_token
// for each as it is produced. Deterministic for a given seed. Only ids below the tokenizer's
// vocabulary size are picked, also when the model's vocabulary is larger (padded).
Generation generate(Model& model, Backend& backend, const Tokenizer& tokenizer, const DocumentBoundary& boundary,
                    std::span<const std::int32_t> prompt, const SamplingOptions& options,
                    const std::function<void(std::int32_t)>& on_token = {});

struct GeneratedText {
  std::string text;  // the new text, end-of-text tokens left out
  std::int64_t tokens = 0;
  StopReason stop = StopReason::length;
};

// Continues the text `prompt` (empty: a new document). on_text, when given, receives the new text
// as it is produced, in whole UTF-8 characters.
GeneratedText generate_text(Model& model, Backend& backend, const Tokenizer& tokenizer,
                            const DocumentBoundary& boundary, std::string_view prompt, const SamplingOptions& options,
                            const std::function<void(std::string_view)>& on_text = {});

// The natural log-probability of each of `tokens` given the prompt and the tokens before it,
// through the same TokenStream that generate() samples from (empty prompt: a new document).
// What a test compares with the evaluation loss.
std::vector<double> log_likelihoods(Model& model, Backend& backend, const DocumentBoundary& boundary,
                                    std::span<const std::int32_t> prompt, std::span<const std::int32_t> tokens,
                                    ContextPolicy policy = ContextPolicy::slide);

// Picks the next token from logits[vocab] (temperature, top-k, top-p), with the uniform draw
// `u` in [0, 1). Exposed for tests.
std::int32_t sample_token(std::vector<float>& logits, const SamplingOptions& options, double u);

// A trained model loaded from a run directory (or a weights file inside one): the run's
// resolved config rebuilds backend, tokenizer and model; the weights and tokenizer state are
// read back.
struct LoadedRun {
  Handle<Backend> backend;
  Handle<Tokenizer> tokenizer;
  Handle<Model> model;
  DocumentBoundary documents;  // from the run's generation.json (write_generation_info)
  std::filesystem::path run_dir;
  // A LoRA run's adapters (lora.rank > 0), loaded; merged into the model's weights unless
  // load_run was asked not to.
  std::shared_ptr<LoraAdapters> lora;
  RunFiles weights;  // what was read: files.description says which weights (the average or the live ones)
};
class Runtime;
// Where the caller runs the loaded model. `host`: a backend whose memory the host cannot read is
// refused (require_host_memory, naming the command: `loom export` reads the weights on the
// host). `backend`: the model is built in the backend's memory, wherever that is, and the
// weights are read into it through explicit copies (`loom generate`, `loom eval`).
enum class RunMemory { host, backend };
// A LoRA run (its config has lora.rank > 0) is its base model (trainer.seed's initialisation,
// then trainer.init_from) with the adapters of `run_or_weights` (a checkpoint's model.safetensors
// or the run directory's adapter_model.safetensors) merged in, unless merge_lora is false.
// `run_or_weights` is a run directory (its final model.safetensors) or a weights file; of a run
// trained with trainer.ema_decay, `choice` picks the average or the live weights
// (choose_weights).
// `memory` and `command` (for the message): see RunMemory.
LoadedRun load_run(Runtime& runtime, const std::filesystem::path& run_or_weights, bool merge_lora = true,
                   WeightsChoice choice = WeightsChoice::ema, RunMemory memory = RunMemory::host,
                   std::string_view command = "loom generate");
// The same for files already resolved (resolve_run_or_checkpoint).
LoadedRun load_run(Runtime& runtime, const RunFiles& files, bool merge_lora = true, RunMemory memory = RunMemory::host,
                   std::string_view command = "loom generate");

// Writes RUN_DIR/generation.json: what generation needs to know about the run's training data
// (Dataset::separator_ends_documents). A run without it (written before it existed) is read as
// `false`.
void write_generation_info(const std::filesystem::path& run_dir, bool separator_ends_documents);

// The run directory `run_or_weights` names (itself, or the directory of a weights file), and a
// UserError naming the path the user gave when it holds no config.yaml.
std::filesystem::path run_directory(const std::filesystem::path& run_or_weights);

}  // namespace loom
