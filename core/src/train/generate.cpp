// Sampling with a KV cache, and loading a trained run back for generation.
#include "loom/core/generate.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "loom/autograd.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/random.hpp"
#include "loom/safetensors.hpp"

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

std::vector<std::int32_t> generate(Model& model, Backend& backend, std::vector<std::int32_t> prompt,
                                   const SamplingOptions& options, const std::function<void(std::int32_t)>& on_token,
                                   std::optional<std::int32_t> end_of_text) {
  if (prompt.empty()) throw UserError("generation needs a prompt of at least one token");
  const std::int64_t context = model.max_seq_len();
  if (static_cast<std::int64_t>(prompt.size()) >= context)
    prompt.erase(prompt.begin(), prompt.end() - (context - 1));  // keep room for one new token
  const std::int64_t max_new =
      std::min<std::int64_t>(options.max_new_tokens, context - static_cast<std::int64_t>(prompt.size()));

  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  auto cache = model.new_cache(1, static_cast<std::int64_t>(prompt.size()) + max_new);

  std::vector<std::int32_t> produced;
  Tensor input =
      Tensor::from(std::span<const std::int32_t>(prompt), Shape{1, static_cast<std::int64_t>(prompt.size())});
  for (std::int64_t i = 0; i < max_new; ++i) {
    Tensor logits = model.next_logits(ops, input, *cache);
    std::vector<float> row = logits.to_vector();
    const double u =
        static_cast<double>(hash_u64(stream_key(options.seed, 5, static_cast<std::uint64_t>(i))) >> 11) * 0x1.0p-53;
    const std::int32_t token = sample_token(row, options, u);
    produced.push_back(token);
    if (on_token) on_token(token);
    if (options.stop_at_end_of_text && end_of_text && token == *end_of_text) break;
    const std::int32_t next[1] = {token};
    input = Tensor::from(std::span<const std::int32_t>(next, 1), Shape{1, 1});
  }
  return produced;
}

LoadedRun load_run(Runtime& runtime, const fs::path& run_or_weights) {
  LoadedRun run;
  std::error_code ec;
  fs::path weights = run_or_weights;
  if (fs::is_directory(run_or_weights, ec)) {
    run.run_dir = run_or_weights;
    weights = run_or_weights / "model.safetensors";
  } else {
    run.run_dir = run_or_weights.parent_path();
  }
  if (!fs::exists(weights, ec))
    throw UserError("no weights at '" + weights.string() +
                    "': give a run directory that holds model.safetensors "
                    "(trainer.save_final: true writes it) or the weights file itself");
  const Value config = runtime.resolved_config();
  auto create = [&](const char* section, std::string_view kind) {
    const Value* node = config.find(section);
    if (!node || node->is_null()) throw UserError("the run's config has no `" + std::string(section) + "` section");
    return runtime.registry().create(kind, ComponentRef{std::string(kind), "", *node, section});
  };
  run.backend = std::static_pointer_cast<Backend>(create("backend", Backend::kind));
  require_host_memory(*run.backend, "loom generate");
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
  run.model->build(ModelSetup{run.tokenizer->vocab_size()});
  const std::vector<ModelParameter> params = run.model->parameters();
  with_context("while loading weights from " + weights.string(),
               [&] { safetensors::load_parameters(weights, params); });
  return run;
}

}  // namespace loom
