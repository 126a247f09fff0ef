#include "train/evaluation.hpp"

#include "loom/autograd.hpp"
#include "train/micro_batches.hpp"
#include "train/mixture.hpp"

namespace loom::training {

namespace {

// What the objective's loss over rows with these targets is a mean over (Objective::count).
std::int64_t count_of(const Objective& objective, const Tensor& targets, std::int64_t seq_len) {
  return objective.count(
      std::span<const std::int32_t>(targets.data<std::int32_t>(), static_cast<std::size_t>(targets.numel())), seq_len);
}

// Each dataset of the mixture on its own validation batches, and the mean over all their
// counts.
Evaluation evaluate_mixture(Objective& objective, const ObjectiveModels& models, Backend& backend,
                            const MixtureDataset& mixture, std::int64_t max_batches, std::int64_t micro_size,
                            std::vector<std::pair<std::string, double>>* per_dataset,
                            const std::function<void(Ops&)>& attach) {
  Evaluation result;
  double weighted = 0;
  std::vector<double> metrics(objective.metric_names().size(), 0.0);
  std::int64_t counted_total = 0;
  Batch batch;
  for (const auto& part : mixture.parts()) {
    const Evaluation e = evaluate(objective, models, backend, *part.dataset, max_batches, micro_size, nullptr, attach);
    if (e.loss < 0) continue;
    std::int64_t counted = 0;
    for (std::int64_t b = 0; b < max_batches; ++b) {
      part.dataset->batch(Split::validation, b, batch);
      counted += objective.count(batch.targets, batch.seq_len);
    }
    weighted += e.loss * static_cast<double>(counted);
    for (std::size_t i = 0; i < metrics.size() && i < e.metrics.size(); ++i)
      metrics[i] += e.metrics[i] * static_cast<double>(counted);
    counted_total += counted;
    if (per_dataset) per_dataset->emplace_back(part.name, e.loss);
  }
  if (counted_total == 0) return result;
  result.loss = weighted / static_cast<double>(counted_total);
  for (double& m : metrics) m /= static_cast<double>(counted_total);
  result.metrics = std::move(metrics);
  return result;
}

}  // namespace

Evaluation evaluate(Objective& objective, const ObjectiveModels& models, Backend& backend, const Dataset& dataset,
                    std::int64_t max_batches, std::int64_t micro_size,
                    std::vector<std::pair<std::string, double>>* per_dataset, const std::function<void(Ops&)>& attach) {
  Evaluation result;
  if (max_batches == 0 || dataset.num_tokens(Split::validation) == 0) return result;
  if (const auto* mixture = dynamic_cast<const MixtureDataset*>(&dataset))
    return evaluate_mixture(objective, models, backend, *mixture, max_batches, micro_size, per_dataset, attach);
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  if (attach) attach(ops);
  Batch batch;
  double weighted = 0;
  std::vector<double> metrics(objective.metric_names().size(), 0.0);
  std::int64_t counted_total = 0;
  for (std::int64_t b = 0; b < max_batches; ++b) {
    dataset.batch(Split::validation, b, batch);
    for_each_micro_batch(batch, micro_size, [&](const MicroBatch& micro) {
      const std::int64_t counted = count_of(objective, micro.targets, batch.seq_len);
      // The batch in: one explicit copy of each tensor to a device backend's memory.
      const Device device = backend.device();
      auto in = [&](const Tensor& t) { return t.defined() ? t.to(device) : t; };
      const ObjectiveLoss loss =
          objective.loss(ops, models, ObjectiveBatch{in(micro.tokens), in(micro.targets), in(micro.segments)});
      weighted += loss.value * static_cast<double>(counted);
      for (std::size_t i = 0; i < metrics.size() && i < loss.metrics.size(); ++i)
        metrics[i] += loss.metrics[i] * static_cast<double>(counted);
      counted_total += counted;
    });
  }
  if (counted_total == 0) return result;
  result.loss = weighted / static_cast<double>(counted_total);
  for (double& m : metrics) m /= static_cast<double>(counted_total);
  result.metrics = std::move(metrics);
  return result;
}

}  // namespace loom::training
