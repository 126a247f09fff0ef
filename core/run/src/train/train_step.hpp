// One optimizer step: forward and backward over the batch's micro-batches (gradients
// accumulate), the global gradient norm, the NaN/Inf check, the skip-bad-step rule, clipping,
// and the optimizer's update with the scheduled learning rate.
#pragma once

#include <cstdint>

#include "loom/kinds/dataset.hpp"
#include "train/components.hpp"
#include "train/train_state.hpp"

namespace loom::training {

struct StepSettings {
  std::uint64_t seed = 0;       // of the dropout streams
  std::int64_t num_steps = 0;   // of the run, for the schedule
  std::int64_t micro_size = 0;  // rows per forward/backward pass; divides the batch
  bool crash_on_nan = true;     // a NaN loss or gradient norm is a UserError
  bool crash_on_inf = true;     // an infinite one too
  float z_loss_weight = 0;      // trainer.z_loss_weight, for every micro-batch's loss
};

struct StepResult {
  double loss = 0;       // the batch's mean loss over its counted targets
  double grad_norm = 0;  // global, before clipping
  double lr = 0;         // the scheduled learning rate
  bool skipped = false;  // by the skip-bad-step rule
};

class TrainStep {
 public:
  TrainStep(RunComponents& components, const StepSettings& settings) : components_(components), settings_(settings) {}

  // Runs step state.step on `batch` and advances `state` past it. Throws UserError when the loss
  // or the gradient norm is NaN or infinite and crash_on_nan / crash_on_inf forbid it.
  StepResult run(const Batch& batch, TrainState& state);

 private:
  // Zeroes the gradients, then forward and backward over each micro-batch, weighted so that the
  // accumulated gradient is the gradient of the whole batch's mean loss. Returns that loss.
  double accumulate_gradients(const Batch& batch, std::int64_t step);
  double global_grad_norm() const;
  void check_finite(std::int64_t step, double loss, double grad_norm) const;
  void clip_gradients(double grad_norm, double max_norm);

  RunComponents& components_;
  StepSettings settings_;
};

}  // namespace loom::training
