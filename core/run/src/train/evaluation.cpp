#include "train/evaluation.hpp"

#include "loom/autograd.hpp"
#include "train/micro_batches.hpp"
#include "train/mixture.hpp"

namespace loom::training {

namespace {

// Each dataset of the mixture on its own validation batches, and the mean over all their
// counted targets.
double evaluate_mixture(Model& model, Backend& backend, const MixtureDataset& mixture, std::int64_t max_batches,
                        std::int64_t micro_size, std::vector<std::pair<std::string, double>>* per_dataset) {
  double weighted = 0;
  std::int64_t counted_total = 0;
  Batch batch;
  for (const auto& part : mixture.parts()) {
    const double loss = evaluate(model, backend, *part.dataset, max_batches, micro_size);
    if (loss < 0) continue;
    std::int64_t counted = 0;
    for (std::int64_t b = 0; b < max_batches; ++b) {
      part.dataset->batch(Split::validation, b, batch);
      counted += count_targets(batch.targets);
    }
    weighted += loss * static_cast<double>(counted);
    counted_total += counted;
    if (per_dataset) per_dataset->emplace_back(part.name, loss);
  }
  return counted_total ? weighted / static_cast<double>(counted_total) : -1;
}

}  // namespace

double evaluate(Model& model, Backend& backend, const Dataset& dataset, std::int64_t max_batches,
                std::int64_t micro_size, std::vector<std::pair<std::string, double>>* per_dataset) {
  if (max_batches == 0 || dataset.num_tokens(Split::validation) == 0) return -1;
  if (const auto* mixture = dynamic_cast<const MixtureDataset*>(&dataset))
    return evaluate_mixture(model, backend, *mixture, max_batches, micro_size, per_dataset);
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  Batch batch;
  double weighted = 0;
  std::int64_t counted_total = 0;
  for (std::int64_t b = 0; b < max_batches; ++b) {
    dataset.batch(Split::validation, b, batch);
    for_each_micro_batch(batch, micro_size, [&](const MicroBatch& micro) {
      weighted += static_cast<double>(model.loss(ops, micro.tokens, micro.targets, micro.segments).item()) *
                  static_cast<double>(micro.counted);
      counted_total += micro.counted;
    });
  }
  return counted_total ? weighted / static_cast<double>(counted_total) : -1;
}

}  // namespace loom::training
