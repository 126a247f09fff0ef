// Sampling with a KV cache, and loading a trained run back for generation.
#include "loom/run/generate.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "checkpoint/sharded_checkpoint.hpp"
#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/random.hpp"
#include "loom/run/run_config.hpp"
#include "loom/safetensors.hpp"
#include "loom/token_windows.hpp"

namespace fs = std::filesystem;

namespace loom {

std::int32_t sample_token(std::vector<float>& logits, const SamplingOptions& options, double u) {
  const auto vocab = static_cast<std::int32_t>(logits.size());
  if (options.temperature <= 0)
    return static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());

  // Candidates sorted by logit, highest first (ties by id, so the order is deterministic).
  std::vector<std::int32_t> ids(static_cast<std::size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  std::size_t keep = ids.size();
  if (options.top_k > 0) keep = std::min<std::size_t>(keep, static_cast<std::size_t>(options.top_k));
  auto by_logit = [&](std::int32_t a, std::int32_t b) {
    return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)] ||
           (logits[static_cast<std::size_t>(a)] == logits[static_cast<std::size_t>(b)] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(keep), ids.end(), by_logit);
  ids.resize(keep);
  double max_logit = -INFINITY;
  for (auto id : ids) max_logit = std::max(max_logit, static_cast<double>(logits[static_cast<std::size_t>(id)]));
  std::vector<double> p(ids.size());
  double total = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    p[i] = std::exp((logits[static_cast<std::size_t>(ids[i])] - max_logit) / options.temperature);
    total += p[i];
  }
  if (options.top_p < 1.0) {
    // The smallest prefix whose probability reaches top_p (at least one token).
    double cumulative = 0;
    std::size_t n = 0;
    while (n < p.size()) {
      cumulative += p[n++] / total;
      if (cumulative >= options.top_p) break;
    }
    p.resize(n);
    ids.resize(n);
    total = std::accumulate(p.begin(), p.end(), 0.0);
  }
  double target = u * total;
  for (std::size_t i = 0; i < p.size(); ++i) {
    target -= p[i];
    if (target < 0) return ids[i];
  }
  return ids.back();
}

// ---- options ----

namespace {

std::string number(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

}  // namespace

void check_sampling_options(const SamplingOptions& options, const SamplingOptionNames& names) {
  if (options.max_new_tokens < 0)
    throw UserError(names.max_new_tokens + " must be at least 0, got " + std::to_string(options.max_new_tokens));
  if (!(options.temperature >= 0) || std::isinf(options.temperature))
    throw UserError(names.temperature + " must be a number >= 0 (0: greedy), got " + number(options.temperature));
  if (options.top_k < 0)
    throw UserError(names.top_k + " must be at least 0 (0: every token), got " + std::to_string(options.top_k));
  if (!(options.top_p > 0 && options.top_p <= 1))
    throw UserError(names.top_p + " must be in (0, 1] (1: every token), got " + number(options.top_p));
}

// ---- the token stream ----

DocumentBoundary document_boundary(const Tokenizer& tokenizer, bool separator_ends_documents) {
  DocumentBoundary boundary;
  if (const auto eot = tokenizer.end_of_text()) {
    boundary.separator = {*eot};
    boundary.separator_ends_documents = true;
    return boundary;
  }
  try {
    boundary.separator = document_separator(tokenizer);
  } catch (const UserError&) {
    // A fitted vocabulary without "\n": see the header.
  }
  if (boundary.separator.empty()) {
    boundary.separator.push_back(0);
    return boundary;
  }
  boundary.separator_ends_documents = separator_ends_documents;
  return boundary;
}

TokenStream::TokenStream(Model& model, Backend& backend, DocumentBoundary boundary, ContextPolicy policy,
                         std::function<void(Ops&)> attach)
    : model_(model),
      backend_(backend),
      boundary_(std::move(boundary)),
      policy_(policy),
      context_(model.max_seq_len()),
      attach_(std::move(attach)) {
  if (boundary_.separator.empty()) throw InternalError("TokenStream: an empty separator");
  if (static_cast<std::int64_t>(boundary_.separator.size()) > context_)
    throw UserError("the document separator (" + std::to_string(boundary_.separator.size()) +
                    " tokens) is longer than the model's context of " + std::to_string(context_));
  cache_ = model_.new_cache(1, context_);
}

TokenStream::~TokenStream() = default;

void TokenStream::run(std::span<const std::int32_t> tokens) {
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend_, &tape);
  ops.set_training(false);
  if (attach_) attach_(ops);
  // The edges of a decoding step on a device backend: the new tokens in, the next token's logits
  // out, each one explicit copy; the weights and the KV cache stay in the backend's memory.
  const Tensor input = Tensor::from(tokens, Shape{1, static_cast<std::int64_t>(tokens.size())}).to(backend_.device());
  logits_ = model_.next_logits(ops, input, *cache_).to_vector();
}

bool TokenStream::ends_with_separator() const {
  const std::vector<std::int32_t>& s = boundary_.separator;
  return boundary_.separator_ends_documents && held_.size() >= s.size() &&
         std::equal(s.begin(), s.end(), held_.end() - static_cast<std::ptrdiff_t>(s.size()));
}

void TokenStream::start(std::span<const std::int32_t> prompt) {
  cache_->reset();
  held_.clear();
  new_document_ = false;
  if (prompt.empty()) {
    // The separator alone, as a row that begins at it: its logits give the document's first
    // token, and the document never sees it (it belongs to the segment before).
    run(boundary_.separator);
    new_document_ = true;
    return;
  }
  if (static_cast<std::int64_t>(prompt.size()) > context_) prompt = prompt.last(static_cast<std::size_t>(context_));
  held_.assign(prompt.begin(), prompt.end());
  run(held_);
  new_document_ = ends_with_separator();
}

bool TokenStream::append(std::int32_t token) {
  if (new_document_) {
    cache_->reset();
    held_.clear();
    new_document_ = false;
  }
  if (static_cast<std::int64_t>(held_.size()) == context_) {
    if (policy_ == ContextPolicy::stop) return false;
    // Drop the oldest quarter and refill the cache from position 0.
    const std::int64_t drop = std::max<std::int64_t>(1, context_ / 4);
    held_.erase(held_.begin(), held_.begin() + drop);
    held_.push_back(token);
    cache_->reset();
    run(held_);
  } else {
    held_.push_back(token);
    const std::int32_t one[1] = {token};
    run(one);
  }
  // A separator that ends documents closes this one: its logits (which see the document, as in
  // training) give the next document's first token, which starts a new segment.
  new_document_ = ends_with_separator();
  return true;
}

// ---- generation ----

Generation generate(Model& model, Backend& backend, const Tokenizer& tokenizer, const DocumentBoundary& boundary,
                    std::span<const std::int32_t> prompt, const SamplingOptions& options,
                    const std::function<void(std::int32_t)>& on_token) {
  check_sampling_options(options);
  const std::optional<std::int32_t> eot = tokenizer.end_of_text();
  Generation out;
  if (options.max_new_tokens == 0) return out;
  TokenStream stream(model, backend, boundary, options.at_context_end, options.attach);
  stream.start(prompt);
  // A model's vocabulary may be larger than its tokenizer's (padded to a multiple, as Hugging
  // Face files often are): the ids past the tokenizer's have no text, so they are never picked.
  const auto candidates = static_cast<std::size_t>(std::max<std::int64_t>(tokenizer.vocab_size(), 1));
  for (std::int64_t i = 0; i < options.max_new_tokens; ++i) {
    std::vector<float> row = stream.logits();
    if (row.size() > candidates) row.resize(candidates);
    const double u =
        static_cast<double>(hash_u64(stream_key(options.seed, 5, static_cast<std::uint64_t>(i))) >> 11) * 0x1.0p-53;
    const std::int32_t token = sample_token(row, options, u);
    out.tokens.push_back(token);
    if (on_token) on_token(token);
    if (options.stop_at_end_of_text && eot && token == *eot) {
      out.stop = StopReason::end_of_text;
      return out;
    }
    if (i + 1 == options.max_new_tokens) break;
    if (!stream.append(token)) {
      out.stop = StopReason::context;
      return out;
    }
  }
  out.stop = StopReason::length;
  return out;
}

GeneratedText generate_text(Model& model, Backend& backend, const Tokenizer& tokenizer,
                            const DocumentBoundary& boundary, std::string_view prompt, const SamplingOptions& options,
                            const std::function<void(std::string_view)>& on_text) {
  const std::vector<std::int32_t> ids = tokenizer.encode(prompt);
  const std::optional<std::int32_t> eot = tokenizer.end_of_text();
  // Decoded incrementally: what the tokens so far decode to beyond what was passed on, cut
  // before an incomplete UTF-8 character, so that characters split across tokens come out whole.
  std::vector<std::int32_t> text_ids;
  std::string text;
  std::size_t passed = 0;
  const Generation g = generate(model, backend, tokenizer, boundary, ids, options, [&](std::int32_t token) {
    if (eot && token == *eot) return;
    text_ids.push_back(token);
    if (!on_text) return;
    text = tokenizer.decode(text_ids);
    std::size_t end = text.size();
    while (end > passed && (static_cast<unsigned char>(text[end - 1]) & 0xC0) == 0x80) --end;
    if (end > passed && static_cast<unsigned char>(text[end - 1]) >= 0xC0) --end;
    if (end > passed) {
      on_text(std::string_view(text).substr(passed, end - passed));
      passed = end;
    }
  });
  GeneratedText out;
  out.text = tokenizer.decode(text_ids);
  if (on_text && out.text.size() > passed) on_text(std::string_view(out.text).substr(passed));
  out.tokens = static_cast<std::int64_t>(g.tokens.size());
  out.stop = g.stop;
  return out;
}

std::vector<double> log_likelihoods(Model& model, Backend& backend, const DocumentBoundary& boundary,
                                    std::span<const std::int32_t> prompt, std::span<const std::int32_t> tokens,
                                    ContextPolicy policy) {
  TokenStream stream(model, backend, boundary, policy);
  stream.start(prompt);
  std::vector<double> out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float>& logits = stream.logits();
    const auto token = static_cast<std::size_t>(tokens[i]);
    if (tokens[i] < 0 || token >= logits.size())
      throw UserError("token id " + std::to_string(tokens[i]) + " is outside the model's vocabulary of " +
                      std::to_string(logits.size()));
    double max_logit = -INFINITY;
    for (const float l : logits) max_logit = std::max(max_logit, static_cast<double>(l));
    double total = 0;
    for (const float l : logits) total += std::exp(static_cast<double>(l) - max_logit);
    out.push_back(static_cast<double>(logits[token]) - max_logit - std::log(total));
    if (i + 1 < tokens.size() && !stream.append(tokens[i])) break;
  }
  return out;
}

fs::path run_directory(const fs::path& run_or_weights) {
  std::error_code ec;
  const auto status = fs::status(run_or_weights, ec);
  if (!fs::exists(status))
    throw UserError("'" + run_or_weights.string() +
                    "' does not exist: give the run directory `loom train` printed (such as runs/<run_id>), or the "
                    "model.safetensors inside one");
  const fs::path dir = fs::is_directory(status) ? run_or_weights : run_or_weights.parent_path();
  const fs::path config = (dir.empty() ? fs::path(".") : dir) / "config.yaml";
  if (!fs::exists(config, ec))
    throw UserError("'" + run_or_weights.string() + "' is not a loom run: there is no " + config.string() +
                    " (give the directory `loom train` printed, such as runs/<run_id>)");
  return config.parent_path();
}

LoadedRun load_run(Runtime& runtime, const fs::path& run_or_weights, bool merge_lora, WeightsChoice choice,
                   RunMemory memory, std::string_view command) {
  std::error_code ec;
  fs::path weights = run_or_weights, run_dir;
  if (fs::is_directory(run_or_weights, ec)) {
    run_dir = run_or_weights;
    weights = run_or_weights / "model.safetensors";
    // A LoRA run's final save: its adapters alone.
    if (!fs::exists(weights, ec) && fs::exists(run_or_weights / "adapter_model.safetensors", ec))
      weights = run_or_weights / "adapter_model.safetensors";
  } else {
    run_dir = run_or_weights.parent_path();
  }
  // A checkpoint whose ranks each wrote a part: the whole tensors are assembled from them.
  if (!fs::exists(weights, ec) && !checkpoint::is_sharded_checkpoint(weights.parent_path()))
    throw UserError("no weights at '" + weights.string() +
                    "': give a run directory that holds model.safetensors "
                    "(trainer.save_final: true writes it) or the weights file itself");
  return load_run(runtime, choose_weights(run_dir.empty() ? fs::path(".") : run_dir, weights, choice), merge_lora,
                  memory, command);
}

LoadedRun load_run(Runtime& runtime, const RunFiles& files, bool merge_lora, RunMemory memory,
                   std::string_view command) {
  LoadedRun run;
  run.run_dir = files.dir;
  run.weights = files;
  const fs::path& weights = files.weights;
  Value config = resolved_run_config(runtime);
  auto create = [&](const char* section, std::string_view kind) {
    const Value* node = config.find(section);
    if (!node || node->is_null()) throw UserError("the run's config has no `" + std::string(section) + "` section");
    return runtime.registry().create(kind, ComponentRef{std::string(kind), "", *node, section});
  };
  run.backend = std::static_pointer_cast<Backend>(create("backend", Backend::kind));
  if (memory == RunMemory::host) require_host_memory(*run.backend, command);
  resolve_attention_kernel(runtime.registry(), config, *run.backend);
  run.tokenizer = std::static_pointer_cast<Tokenizer>(create("tokenizer", Tokenizer::kind));
  run.model = std::static_pointer_cast<Model>(create("model", Model::kind));
  if (std::ifstream state_file{run.run_dir / "tokenizer.state", std::ios::binary}) {
    std::stringstream ss;
    ss << state_file.rdbuf();
    run.tokenizer->load_state(ss.str());
  } else if (run.tokenizer->needs_fit()) {
    throw UserError("the run's tokenizer learns its vocabulary from the training data, and '" +
                    (run.run_dir / "tokenizer.state").string() + "' (where the run saved it) is missing");
  }
  bool separator_ends_documents = false;
  if (std::ifstream info_file{run.run_dir / "generation.json"}) {
    std::stringstream ss;
    ss << info_file.rdbuf();
    const nlohmann::json info = nlohmann::json::parse(ss.str(), nullptr, false);
    if (!info.is_object() || !info.contains("separator_ends_documents") ||
        !info["separator_ends_documents"].is_boolean())
      throw UserError("'" + (run.run_dir / "generation.json").string() +
                      "' is not what `loom train` writes: expected {\"separator_ends_documents\": true or false}");
    separator_ends_documents = info["separator_ends_documents"].get<bool>();
  }
  run.documents = document_boundary(*run.tokenizer, separator_ends_documents);
  ModelSetup setup{run.tokenizer->vocab_size()};
  // In the backend's memory (parameters allocated and initialised there, the weights read in
  // through explicit copies); for a host backend that is where they always were.
  if (memory == RunMemory::backend) setup.backend = run.backend.get();
  run.model->build(setup);
  if (lora_settings(config).enabled()) {
    run.lora = load_lora_model(*run.model, *run.backend, config, files, merge_lora);
    return run;
  }
  const std::vector<ModelParameter> params = run.model->parameters();
  with_context("while loading weights from " + weights.string(), [&] { load_run_weights(files, params); });
  return run;
}

void write_generation_info(const fs::path& run_dir, bool separator_ends_documents) {
  std::ofstream f(run_dir / "generation.json");
  f << nlohmann::json{{"separator_ends_documents", separator_ends_documents}}.dump() << "\n";
  if (!f) throw UserError("cannot write '" + (run_dir / "generation.json").string() + "'");
}

}  // namespace loom
