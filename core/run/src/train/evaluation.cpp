#include "train/evaluation.hpp"

#include "loom/autograd.hpp"
#include "train/micro_batches.hpp"

namespace loom::training {

double evaluate(Model& model, Backend& backend, const Dataset& dataset, std::int64_t max_batches,
                std::int64_t micro_size) {
  if (max_batches == 0 || dataset.num_tokens(Split::validation) == 0) return -1;
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
