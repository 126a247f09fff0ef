// One optimizer step: forward and backward over the batch's micro-batches (gradients
// accumulate), the global gradient norm, the NaN/Inf check, the skip-bad-step rule, clipping,
// and the optimizer's update with the scheduled learning rate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/kinds/dataset.hpp"
#include "train/components.hpp"
#include "train/train_state.hpp"
#include "train/world.hpp"

namespace loom::training {

struct StepSettings {
  std::uint64_t seed = 0;       // of the dropout streams
  std::int64_t num_steps = 0;   // of the run, for the schedule
  std::int64_t micro_size = 0;  // rows per forward/backward pass; divides the batch
  bool overlap_reduce = true;   // data parallel: reduce gradient buckets during backward (for
                                // components whose strategies set_up_run did not build)
  bool crash_on_nan = true;     // a NaN loss or gradient norm is a UserError
  bool crash_on_inf = true;     // an infinite one too
  float z_loss_weight = 0;      // trainer.z_loss_weight, for every micro-batch's loss
};

struct StepResult {
  double loss = 0;              // the batch's loss: the objective's mean over the batch's count()
  double grad_norm = 0;         // global, before clipping
  double lr = 0;                // the scheduled learning rate
  bool skipped = false;         // not applied: by the skip-bad-step rule, or a NaN or infinite loss or norm
  std::vector<double> metrics;  // the objective's metric_names(), over the batch
};

class TrainStep {
 public:
  // `world`: this rank takes its rows of each batch, and gradients and loss are summed over the
  // ranks before the norm, so every rank takes the same decisions and update.
  // The step iterates over components.strategies (train/strategy.hpp) and names none of them;
  // components assembled without set_up_run get theirs built here.
  TrainStep(RunComponents& components, World& world, const StepSettings& settings);

  // Runs step state.step on `batch` and advances `state` past it. Throws UserError when the loss
  // or the gradient norm is NaN or infinite and crash_on_nan / crash_on_inf forbid it.
  StepResult run(const Batch& batch, TrainState& state);

  // The NaN or infinite loss or norm that run() stopped on (set just before it throws), for the
  // step loop's record of how the run ended; `step` counts from 1, as the metrics do.
  struct Divergence {
    std::int64_t step = 0;
    double loss = 0, grad_norm = 0;
    std::string what;     // "NaN loss", "infinite gradient norm"
    std::string message;  // the error's: "step 8: the loss is NaN (...)"
  };
  const std::optional<Divergence>& divergence() const { return divergence_; }

 private:
  // Zeroes the gradients, then forward and backward over each micro-batch, weighted so that the
  // accumulated gradient is the gradient of the whole batch's loss (a mean over the objective's
  // count()). Returns that loss, this rank's part; `metrics` gets this rank's part of the
  // objective's metrics.
  double accumulate_gradients(const Batch& batch, std::int64_t step, std::vector<double>& metrics);
  // Around each micro-batch after a rank's first: its gradients are computed afresh and then
  // added to the sum of the earlier ones, so the sum is ((g0 + g1) + g2) + ..., in micro-batch
  // order, exactly what the data-parallel reduction does with one micro-batch per rank.
  void set_aside_gradients();
  void add_set_aside_gradients();
  void add_set_aside_gradient(Parameter& p);
  void add_set_aside_gradient(std::size_t index);
  double global_grad_norm() const;
  void check_finite(std::int64_t step, double loss, double grad_norm);
  void clip_gradients(double grad_norm, double max_norm);

  RunComponents& components_;
  World& world_;
  StepSettings settings_;
  const Strategies& strategies_;
  std::optional<Divergence> divergence_;
  std::vector<Tensor> set_aside_;  // per parameter: the sum of the earlier micro-batches' gradients
  std::vector<bool> has_set_aside_;
  std::unordered_map<const Parameter*, std::size_t> index_;  // position in components_.parameters
  // global_grad_norm's chunks of the gradients and their sums, kept between steps.
  struct NormChunk {
    const float* data;  // a host pointer, or a device address (host false)
    std::int64_t n;
    bool host;           // summed on the pool; else by the backend's sum_of_squares kernel
    std::int64_t whole;  // a device gradient's first chunk: the gradient's size (one kernel call)
  };
  mutable std::vector<NormChunk> norm_chunks_;
  mutable std::vector<double> norm_partials_;
  // The device chunks' partials in the backend's memory (a double in two f32 slots each), copied
  // to norm_partials_ in one copy per step.
  mutable Tensor norm_device_partials_;
  mutable std::vector<NormPart> norm_parts_;
};

}  // namespace loom::training
