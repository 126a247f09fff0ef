// Where a training run stands between steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "loom/run/trainer.hpp"
#include "train/ema.hpp"

namespace loom::training {

// What the next step depends on beyond the components' own state (the model's parameters, the
// optimizer's moments): what a checkpoint must save with them for a resumed run to continue
// exactly where this one stopped. The data order and dropout draw from streams keyed by the
// step, so `step` is also the data cursor.
struct TrainState {
  std::int64_t step = 0;                  // steps done: the index of the next step and of its batch
  std::int64_t skipped_steps = 0;         // steps whose update was skipped (a bad step or a non-finite gradient norm)
  std::optional<SkipStepRule> skip_rule;  // with its window of past losses and norms, under trainer.skip_bad_steps
  // The weight average under trainer.ema_decay > 0 (null otherwise): ema->state() is its named
  // tensors ("ema/<parameter>") for the checkpoint.
  std::shared_ptr<ParameterEma> ema;
};

}  // namespace loom::training
