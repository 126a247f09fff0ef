// Where a training run stands between steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "loom/run/trainer.hpp"
#include "train/ema.hpp"

namespace loom::training {

// The log interval in progress and the run's clocks: what the next log line is computed from.
struct LogInterval {
  std::int64_t steps = 0;     // steps since the last log line
  double loss_sum = 0;        // of their losses
  double seconds = 0;         // in their steps
  double train_seconds = 0;   // in every step of the run, evaluation and checkpoints excluded
  double elapsed_before = 0;  // wall time of the run's earlier parts (before a resume)
  // Of the interval's targets, those that count toward the loss (not -1): its trained tokens.
  std::int64_t trained_tokens = 0;
};

// What the next step depends on beyond the components' own state (the model's parameters, the
// optimizer's moments): what a checkpoint saves with them (state.json) for a resumed run to
// continue exactly where this one stopped. The data order and dropout draw from streams keyed
// by the step, so `step` is also the data cursor and the dropout stream's position.
struct TrainState {
  std::int64_t step = 0;                  // steps done: the index of the next step and of its batch
  std::int64_t skipped_steps = 0;         // steps whose update was skipped (a bad step or a non-finite gradient norm)
  std::optional<SkipStepRule> skip_rule;  // with its window of past losses and norms, under trainer.skip_bad_steps
  LogInterval interval;
  // The weight average under trainer.ema_decay > 0 (null otherwise): ema->state() is its named
  // tensors ("ema/<parameter>"), training state for the checkpoint.
  std::shared_ptr<ParameterEma> ema;
};

}  // namespace loom::training
