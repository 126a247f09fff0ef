// `loom eval`: benchmark tasks scored as EleutherAI's lm-evaluation-harness (v0.4) scores them,
// from local files (docs/evaluation.md):
//   * multiple choice by log-likelihood (hellaswag, arc_easy, arc_challenge, piqa, winogrande,
//     mmlu, and a generic {"context", "choices", "label"} JSONL): acc and acc_norm (the choice's
//     log-likelihood divided by its length in characters), with the harness's prompt formats and
//     target delimiters;
//   * lambada: the last word's log-likelihood and whether greedy decoding gives it, whole;
//   * perplexity: a text's rolling log-likelihood over windows of the model's full context
//     (the harness's loglikelihood_rolling), as word, byte and token perplexity and bits per byte.
//
// Requests are scored as the harness's HFLM scores them: the pair (context, continuation) is
// encoded as encode(context + continuation) split after encode(context)'s length (trailing
// spaces of the context move to the continuation); an empty context is the document separator;
// a request longer than the context keeps its last tokens.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "loom/core/runtime.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/run/generate.hpp"

namespace loom::eval {

enum class TaskFamily {
  hellaswag,
  arc_easy,
  arc_challenge,
  piqa,
  winogrande,
  mmlu,
  lambada,
  perplexity,
  multiple_choice
};

// "hellaswag", ... "multiple_choice".
std::string family_name(TaskFamily family);
// The family of a name; nullopt for an unknown one.
std::optional<TaskFamily> family_of(const std::string& name);

// One entry of --tasks or trainer.eval_tasks: which family, from which file, under which name.
struct TaskSpec {
  std::string name;  // the family's name, or a generic or perplexity file's stem
  TaskFamily family = TaskFamily::multiple_choice;
  std::filesystem::path file;
};

// Parses "NAME_OR_FILE[,NAME_OR_FILE...]" (commas, or one entry per list element):
//   FAMILY:PATH      the file PATH in FAMILY's format;
//   FAMILY           task_dir/FAMILY.jsonl;
//   PATH             a file whose name starts with a family's name (hellaswag_val.jsonl), a .txt
//                    file (perplexity) or any other JSONL (generic multiple choice, named by its stem).
// UserError for an unknown family, a missing file, or two tasks of one name.
std::vector<TaskSpec> parse_task_specs(const std::vector<std::string>& entries, const std::filesystem::path& task_dir);

// A log-likelihood request in text: the harness's (context, continuation).
struct TextRequest {
  std::string context, continuation;
};

// One document of a task.
struct TaskDoc {
  std::vector<TextRequest> requests;   // multiple choice: one per choice; lambada: one
  std::vector<double> choice_lengths;  // characters of each choice (acc_norm)
  std::int64_t gold = -1;              // the correct choice
  std::string text;                    // perplexity: the document
  std::string group;                   // mmlu: the subject
  std::string description;             // mmlu: the task's description, before any few-shot example
  std::string example;                 // as a few-shot example: its text, target delimiter, answer and "\n\n"
  std::string identity;                // its JSON line, parsed: the harness never takes a document as its own example
  std::string where;                   // its file and line ("piqa.jsonl:7"; a .txt file: the file), for errors
};

struct Task {
  TaskSpec spec;
  std::vector<TaskDoc> docs;
};

// Few-shot prompts as lm-evaluation-harness 0.4.5 builds them (--num-fewshot).
struct FewShotOptions {
  std::int64_t num_fewshot = 0;  // examples before each document; 0: zero-shot
  std::uint32_t seed = 1234;     // the harness's fewshot_random_seed
};

// Reads spec.file (its first `limit` documents; 0: all). UserError naming file and line for a
// line that is not JSON, lacks a field of the family's format or has a label out of range.
// With fewshot.num_fewshot K > 0, each document's contexts start with K examples drawn from all
// the file's documents as the harness's sampler draws them from a split (mmlu: the first K; the
// others: random.Random(seed).sample, one draw per document in order, of K + 1 for hellaswag,
// piqa and winogrande, whose harness YAML has no test split), leaving out the document itself,
// each example followed by "\n\n", after mmlu's description. UserError for a perplexity task and
// for a file with fewer documents than the draw.
Task load_task(const TaskSpec& spec, std::int64_t limit = 0, const FewShotOptions& fewshot = {});

// A request in tokens.
struct TokenRequest {
  std::vector<std::int32_t> context, continuation;
};

// The harness's _encode_pair (see above); `prefix` stands for an empty context.
TokenRequest encode_request(const Tokenizer& tokenizer, const TextRequest& request, std::int32_t prefix);

// The harness's rolling windows (get_rolling_token_windows with context_len 1, made disjoint):
// every token of `tokens` predicted once, each window with up to max_len tokens of context.
std::vector<TokenRequest> rolling_windows(std::span<const std::int32_t> tokens, std::int32_t prefix,
                                          std::int64_t max_len);

// A task's requests in tokens, as evaluate_tasks scores them.
struct EncodedTask {
  std::vector<TokenRequest> requests;  // multiple choice: each document's choices; perplexity: its rolling windows
  std::vector<std::size_t> sizes;      // requests of each document
  std::vector<std::int64_t> tokens;    // perplexity: each document's tokens
};

// Encodes every request of `task` (encode_request; a perplexity document's rolling_windows).
// UserError naming the task file and the document's line for a request the model cannot score as
// the harness would: a continuation longer than max_len tokens (the harness asserts
// len(continuation_enc) <= max_length), and a continuation that is empty or encodes to no token
// on its own (it asserts len(continuation_enc) > 0). A continuation whose tokens all merged into
// the context's last token ("pre" + "fix") is no error: it scores 0 and greedy, as the harness's
// logits cache gives it.
EncodedTask encode_task(const Task& task, const Tokenizer& tokenizer, std::int32_t prefix, std::int64_t max_len);

struct Scored {
  double logprob = 0;   // sum of the continuation's log-probabilities
  bool greedy = false;  // whether each continuation token is the argmax
};

// Multiple choice whose choices share a context: whether the context runs once into a KV cache that
// each choice continues from (models built on CausalLm), or each choice is a row of its own, context
// included, as in the harness.
enum class KvCacheUse {
  automatic,  // where it saves most of the work: a context of 64 tokens or more that is at least half
              // of the positions the rows would run (on 2 cores, a shorter one costs more in passes
              // than it saves)
  always,     // every document of two choices or more
  never,      // the harness's way
};

// "auto", "always" or "never"; UserError naming `option` otherwise.
KvCacheUse parse_kv_cache_use(const std::string& text, const std::string& option);

struct ScorerOptions {
  std::int64_t batch_size = 8;  // rows per forward pass
  KvCacheUse kv_cache = KvCacheUse::automatic;
};

// What the scorer did, for the log and the benchmark.
struct ScorerStats {
  std::int64_t requests = 0;
  std::int64_t forward_passes = 0;
  std::int64_t tokens_run = 0;  // positions through the model, padding included
};

// Scores log-likelihood requests: identical inputs once, rows sorted longest first (the
// harness's order), batch_size rows per forward pass, padded on the right.
class Scorer {
 public:
  Scorer(Model& model, Backend& backend, ScorerOptions options);
  // Each request's result, in order; an empty continuation (its tokens merged into the context's
  // last one) scores 0, greedy, as the harness's logits cache gives it. UserError for one longer
  // than the model's context.
  std::vector<Scored> score(std::span<const TokenRequest> requests);
  // Requests grouped by document: each group's requests share their context (multiple choice).
  // Through the KV cache as options.kv_cache says; the rest as score() over all of them.
  std::vector<Scored> score_grouped(std::span<const TokenRequest> requests, std::span<const std::size_t> group_sizes);
  const ScorerStats& stats() const { return stats_; }

 private:
  bool score_with_cache(std::span<const TokenRequest> group, std::span<Scored> out);
  Model& model_;
  Backend& backend_;
  ScorerOptions options_;
  ScorerStats stats_;
};

// A metric as the harness reports it: value and standard error (none where the harness has none
// or fewer than two documents).
struct Metric {
  std::string name;
  double value = 0;
  std::optional<double> stderr_value;
};

// One document's outcome, for --log-samples.
struct DocLog {
  std::int64_t index = 0;
  std::vector<Scored> results;
  std::int64_t gold = -1;
  std::int64_t pred = -1, pred_norm = -1;
  std::int64_t tokens = 0;  // perplexity: tokens of the document
};

struct TaskResult {
  std::string name;
  TaskFamily family = TaskFamily::multiple_choice;
  std::int64_t docs = 0;
  std::vector<Metric> metrics;
  std::vector<DocLog> samples;
  double seconds = 0;
  // mmlu: its categories and subjects as the harness reports them (mmlu_stem, mmlu_anatomy, ...),
  // each category followed by its subjects; `group` names the result each is part of.
  std::vector<TaskResult> subtasks;
  std::string group;
};

struct EvalOptions {
  ScorerOptions scorer;
  bool log_samples = false;
};

// Scores every task, each encoded first (encode_task: a document the model cannot score is a
// UserError before any scoring). `prefix` is the token that stands for an empty context (the
// harness's prefix_token_id: the tokenizer's BOS, or its EOS; a run's document separator).
std::vector<TaskResult> evaluate_tasks(Model& model, Backend& backend, const Tokenizer& tokenizer, std::int32_t prefix,
                                       const std::vector<Task>& tasks, const EvalOptions& options,
                                       ScorerStats* stats = nullptr);

// The metrics of a task from its documents' results (exposed for tests): acc, acc_norm
// (multiple choice), perplexity and acc (lambada), word_perplexity, byte_perplexity,
// bits_per_byte and token_perplexity (perplexity).
std::vector<Metric> task_metrics(const Task& task, std::span<const DocLog> docs);

// mmlu's per-category and per-subject results (TaskResult::subtasks) from its documents' results
// (exposed for tests): the categories of lm-evaluation-harness 0.4.5 (humanities, other,
// social_sciences, stem), each the size-weighted mean of its subjects with their pooled standard
// error; a subject the harness does not know belongs to none.
std::vector<TaskResult> mmlu_subtasks(const Task& task, std::span<const DocLog> docs);

// The harness's standard error of a mean: the sample standard deviation over sqrt(n).
std::optional<double> mean_stderr(std::span<const double> values);

// The model `loom eval` scores.
struct EvalModel {
  Handle<Backend> backend;
  Handle<Tokenizer> tokenizer;
  Handle<Model> model;
  std::int32_t prefix = 0;  // what stands for an empty context: the end-of-text token or the document separator
  std::string description;  // which weights, for the log
  std::shared_ptr<LoraAdapters> lora;
};

// `loom eval` computes in float32, as the harness's HFLM with dtype=float32: the override
// "backend.matmul_precision=f32" when the config's backend declares that option (the cpu
// backend's default takes bf16 products where the CPU has AVX512-BF16) and `overrides` (the
// command line's) set neither it nor the whole backend; nullopt otherwise (the user's own choice,
// bf16 included, stands).
std::optional<std::string> float32_products_override(const Runtime& runtime, const std::vector<std::string>& overrides);

// What the harness's HFLM puts before an empty context for a Hugging Face model directory (its
// prefix_token_id): the tokenizer's BOS, or its EOS where it has none, as transformers 4.46 reads
// them (special_tokens_map.json over tokenizer_config.json, else the default of the tokenizer
// class, tokenizer_config.json's tokenizer_class or AutoTokenizer's for config.json's model_type,
// as the plugin declaring that class in `registry` gives it: Registrar::add_hf_tokenizer_class;
// loom's model plugins declare GPT-2's "<|endoftext|>", Qwen2's no BOS and "<|endoftext|>",
// Llama's "<s>", Gemma's "<bos>"), the id from tokenizer.json or vocab.json (else `tokenizer`'s
// encoding of it, when one token). config.json's bos_token_id plays no part. nullopt where the
// directory names neither and no plugin declares its class.
std::optional<std::int32_t> hf_prefix_token(const Registry& registry, const std::filesystem::path& dir,
                                            const Tokenizer& tokenizer);

// A loom run directory, checkpoint or weights file (its own config; a LoRA run's adapters merged
// into its base model), or a Hugging Face model directory (config.json and safetensors) read
// through trainer.init_from's loader into the model that runtime's config describes.
EvalModel load_eval_model(Runtime& runtime, const std::filesystem::path& target, WeightsChoice choice);

// evaluate_tasks on the model load_eval_model loaded, as `loom generate` runs it: a LoRA run's
// adapters are merged into a float32 base, and applied in the products of a base stored in fewer
// bits (lora.base_dtype bf16, int8, nf4: LinearAdaptersScope over the scoring), which has no
// float32 value to merge into.
std::vector<TaskResult> evaluate_tasks(const EvalModel& model, const std::vector<Task>& tasks,
                                       const EvalOptions& options, ScorerStats* stats = nullptr);

// The results as JSON: {"results": {task: {metric: value, metric_stderr: value or null, "docs": n,
// "seconds": s}}, "samples": {task: [per document]} when logged}.
std::string results_json(const std::vector<TaskResult>& results, const std::string& model_description);

}  // namespace loom::eval
