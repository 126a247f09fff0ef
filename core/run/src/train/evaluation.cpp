#include "train/evaluation.hpp"

#include "loom/autograd.hpp"
#include "train/micro_batches.hpp"
#include "train/mixture.hpp"

namespace loom::training {

namespace {

// The sum of the losses over the counted targets of validation batches 0 .. max_batches - 1, and
// their count.
std::pair<double, std::int64_t> validation_loss_sum(Model& model, Ops& ops, const Dataset& dataset,
                                                    std::int64_t max_batches, std::int64_t micro_size) {
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
  return {weighted, counted_total};
}

}  // namespace

double evaluate(Model& model, Backend& backend, const Dataset& dataset, std::int64_t max_batches,
                std::int64_t micro_size, std::vector<std::pair<std::string, double>>* per_dataset) {
  if (max_batches == 0 || dataset.num_tokens(Split::validation) == 0) return -1;
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  const auto* mixture = dynamic_cast<const MixtureDataset*>(&dataset);
  if (!mixture) {
    const auto [weighted, counted] = validation_loss_sum(model, ops, dataset, max_batches, micro_size);
    return counted ? weighted / static_cast<double>(counted) : -1;
  }
  // A mixture: each dataset's own validation batches, and the mean over all their targets.
  double weighted = 0;
  std::int64_t counted = 0;
  for (const auto& part : mixture->parts()) {
    if (part.dataset->num_tokens(Split::validation) == 0) continue;
    const auto [w, n] = validation_loss_sum(model, ops, *part.dataset, max_batches, micro_size);
    if (n == 0) continue;
    weighted += w;
    counted += n;
    if (per_dataset) per_dataset->emplace_back(part.name, w / static_cast<double>(n));
  }
  return counted ? weighted / static_cast<double>(counted) : -1;
}

}  // namespace loom::training
