// The text samples a run prints and records: trainer.sample_prompt continued by the model as it
// stands, with the trainer's sampling options and the run's sampling stream.
#pragma once

#include <cstdint>
#include <string>

#include "loom/kinds/backend.hpp"
#include "loom/kinds/model.hpp"
#include "loom/kinds/tokenizer.hpp"
#include "loom/options.hpp"
#include "train/components.hpp"

namespace loom::training {

class Sampler {
 public:
  Sampler(const RunComponents& components, const Options& trainer, std::uint64_t seed)
      : backend_(components.backend),
        tokenizer_(components.tokenizer),
        model_(components.model),
        separator_ends_documents_(components.dataset->separator_ends_documents()),
        trainer_(trainer),
        seed_(seed),
        strategies_(components.strategies) {}

  // The prompt followed by up to `length` sampled tokens, as text; an empty prompt starts a new
  // document the way the training data starts one (see generate.hpp, document_boundary).
  std::string sample(std::int64_t length);

 private:
  Handle<Backend> backend_;
  Handle<Tokenizer> tokenizer_;
  Handle<Model> model_;
  bool separator_ends_documents_;
  Options trainer_;
  std::uint64_t seed_ = 0;
  // Every Ops that runs the model is attached to them (under tensor parallelism every member of
  // the group samples, through the group).
  Strategies strategies_;
};

}  // namespace loom::training
