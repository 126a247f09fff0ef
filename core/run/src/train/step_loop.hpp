// The steps of a run that is set up, and what ends it: per step a batch, the step, and at their
// intervals the metrics, an evaluation and a sample; then the final evaluation, the weights, the
// final sample and the summary.
#pragma once

#include "loom/run/trainer.hpp"
#include "train/progress.hpp"
#include "train/run_setup.hpp"

namespace loom::training {

// Runs steps run.state.step .. run.num_steps - 1 and finishes the run.
TrainSummary execute(Run& run, ProgressPrinter& progress);

}  // namespace loom::training
