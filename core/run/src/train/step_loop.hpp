// The steps of a run that is set up, and what ends it: per step a batch, the step, the hooks
// (train/hooks/run_hooks.hpp: each at its interval) and a check for a stop; then the final
// evaluation, the weights, the final sample, checkpoint and task evaluation, and the summary.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "loom/run/trainer.hpp"
#include "train/progress.hpp"
#include "train/run_setup.hpp"

namespace loom::training {

// Hooks of Trainer::add_hook, each with its interval.
using AddedHooks = std::vector<std::pair<TrainHook, std::int64_t>>;

// Runs steps run.state.step .. run.num_steps - 1 with the run's hooks and `hooks`, and finishes
// the run.
TrainSummary execute(Run& run, ProgressPrinter& progress, const AddedHooks& hooks = {});

}  // namespace loom::training
