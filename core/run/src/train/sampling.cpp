#include "train/sampling.hpp"

#include <optional>
#include <vector>

#include "loom/random.hpp"
#include "loom/run/generate.hpp"

namespace loom::training {

std::string Sampler::sample(std::int64_t length) {
  std::vector<std::int32_t> prompt = tokenizer_->encode(trainer_.get<std::string>("sample_prompt"));
  const std::optional<std::int32_t> eot = tokenizer_->end_of_text();
  if (prompt.empty()) {
    if (eot)
      prompt.push_back(*eot);
    else
      prompt = tokenizer_->encode("\n");
    if (prompt.empty()) prompt.push_back(0);
  }
  SamplingOptions options;
  options.max_new_tokens = length;
  options.temperature = trainer_.get<double>("sample_temperature");
  options.top_k = trainer_.get<std::int64_t>("sample_top_k");
  options.seed = stream_key(seed_, 4, 0);
  const std::vector<std::int32_t> tokens = generate(*model_, *backend_, prompt, options, {}, eot);
  std::vector<std::int32_t> text_ids;
  for (auto t : tokens)
    if (!eot || t != *eot) text_ids.push_back(t);
  return trainer_.get<std::string>("sample_prompt") + tokenizer_->decode(text_ids);
}

}  // namespace loom::training
