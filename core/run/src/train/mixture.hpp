// Weighted mixtures of datasets (Levanter's `train_weights`): the `data` section may name several
// datasets, each batch drawing its sequences from them in proportion to weights that may change
// over a schedule of (step, weights) pairs.
//
//   data:
//     mixture:                     # NAME: a dataset section, as `data` holds for one dataset
//       web: {type: jsonl, paths: [data/web.jsonl]}
//       chat: {type: chat, paths: [data/chat.jsonl]}
//     weights: {web: 3, chat: 1}   # relative; default: equal
//     weight_schedule:             # optional: from `step` on, these weights
//       - {step: 1000, weights: {web: 1, chat: 1}}
//
// Batch b (the batch of step b) takes round(w_d * batch_size) rows from dataset d by systematic
// sampling (a seeded offset per batch, so every count is the floor or the ceiling of its share and
// the long-run proportions are the weights exactly), in a seeded row order. Dataset d's rows are
// its own sequences in its own order: its k-th sequence is row k % batch_size of its batch
// k / batch_size, k counting the rows it gave to batches 0 .. b - 1 before. All of it is a pure
// function of (seed, b) and the config, so the mixture has no cursor beyond the step: a resumed
// run sees the same batches. Validation batches mix the datasets that have a validation split by
// `weights` in the same way; evaluation also takes each dataset's own validation batches
// (eval/NAME/loss).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/kinds/dataset.hpp"
#include "loom/value.hpp"

namespace loom::training {

// Whether a `data` section is a mixture (a map with `mixture`).
bool is_mixture(const Value& data);

// A mixture's `data` section validated (each dataset against its own options, the weights and the
// schedule against the datasets' names), with defaults filled in. UserError naming what is wrong.
Value validate_mixture(const Value& data, const config::ComponentCatalog& catalog);

class MixtureDataset final : public Dataset {
 public:
  struct Part {
    std::string name;
    Handle<Dataset> dataset;
  };
  // `data`: the validated section (validate_mixture).
  MixtureDataset(const Registry& registry, const Value& data);

  void prepare(const DatasetSetup& setup) override;
  void batch(Split split, std::int64_t index, Batch& out) const override;
  std::int64_t num_tokens(Split split) const override;
  bool separator_ends_documents() const override;

  const std::vector<Part>& parts() const { return parts_; }
  // The normalised weights in force at `step`.
  const std::vector<double>& weights_at(std::int64_t step) const;
  // Which dataset each row of training batch `index` comes from.
  std::vector<std::int32_t> row_sources(std::int64_t index) const;

 private:
  // Rows per dataset of batch `index` of the training split.
  std::vector<std::int64_t> train_counts(std::int64_t index) const;
  // Rows each dataset gave to training batches 0 .. index - 1.
  std::vector<std::int64_t> train_counts_before(std::int64_t index) const;
  void assemble(Split split, const std::vector<std::int32_t>& sources, const std::vector<std::int64_t>& before,
                Batch& out) const;

  std::vector<Part> parts_;
  std::vector<std::pair<std::int64_t, std::vector<double>>> schedule_;  // (first step, weights), ascending
  std::vector<double> validation_weights_;                              // over the parts with validation data
  std::int64_t batch_size_ = 0, seq_len_ = 0;
  std::uint64_t seed_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<std::vector<std::int64_t>> checkpoints_;  // counts before batch k * kCheckpointEvery
};

}  // namespace loom::training
