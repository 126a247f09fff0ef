// Text generation from a model, with a KV cache: the prompt runs once, then one forward pass
// per new token over that token alone.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/tokenizer.hpp"

namespace loom {

struct SamplingOptions {
  std::int64_t max_new_tokens = 200;
  double temperature = 1.0;  // 0: greedy
  std::int64_t top_k = 0;    // 0: off
  double top_p = 1.0;        // 1: off
  std::uint64_t seed = 0;
  bool stop_at_end_of_text = true;
};

// Samples up to max_new_tokens tokens after `prompt` (at least one token; the prompt is cut to
// the model's context from the left if needed), calling on_token for each as it is produced.
// Deterministic for a given seed. Generation stops at the model's context length.
std::vector<std::int32_t> generate(Model& model, Backend& backend, std::vector<std::int32_t> prompt,
                                   const SamplingOptions& options,
                                   const std::function<void(std::int32_t)>& on_token = {},
                                   std::optional<std::int32_t> end_of_text = std::nullopt);

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
  std::filesystem::path run_dir;
};
class Runtime;
LoadedRun load_run(Runtime& runtime, const std::filesystem::path& run_or_weights);

}  // namespace loom
