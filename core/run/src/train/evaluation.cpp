#include "train/evaluation.hpp"

#include "loom/autograd.hpp"
#include "train/micro_batches.hpp"

namespace loom::training {

Evaluation evaluate(Objective& objective, const ObjectiveModels& models, Backend& backend, const Dataset& dataset,
                    std::int64_t max_batches, std::int64_t micro_size) {
  Evaluation result;
  if (max_batches == 0 || dataset.num_tokens(Split::validation) == 0) return result;
  Tape tape;
  tape.set_enabled(false);
  Ops ops(backend, &tape);
  ops.set_training(false);
  Batch batch;
  double weighted = 0;
  std::vector<double> metrics(objective.metric_names().size(), 0.0);
  std::int64_t counted_total = 0;
  for (std::int64_t b = 0; b < max_batches; ++b) {
    dataset.batch(Split::validation, b, batch);
    for_each_micro_batch(batch, micro_size, [&](const MicroBatch& micro) {
      const std::int64_t counted =
          objective.count(std::span<const std::int32_t>(micro.targets.data<std::int32_t>(),
                                                        static_cast<std::size_t>(micro.targets.numel())),
                          batch.seq_len);
      const ObjectiveLoss loss =
          objective.loss(ops, models, ObjectiveBatch{micro.tokens, micro.targets, micro.segments});
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
