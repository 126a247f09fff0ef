#include "train/sampling.hpp"

#include "loom/random.hpp"
#include "loom/run/generate.hpp"

namespace loom::training {

std::string Sampler::sample(std::int64_t length) {
  SamplingOptions options;
  options.max_new_tokens = length;
  options.temperature = trainer_.get<double>("sample_temperature");
  options.top_k = trainer_.get<std::int64_t>("sample_top_k");
  options.top_p = trainer_.get<double>("sample_top_p");
  options.seed = stream_key(seed_, 4, 0);
  options.attach = [this](Ops& ops) {
    for (const auto& strategy : strategies_) strategy->attach(ops);
  };
  const std::string prompt = trainer_.get<std::string>("sample_prompt");
  const DocumentBoundary documents = document_boundary(*tokenizer_, separator_ends_documents_);
  return prompt + generate_text(*model_, *backend_, *tokenizer_, documents, prompt, options).text;
}

}  // namespace loom::training
