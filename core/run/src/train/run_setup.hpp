// Everything a training run does before its first step: the config resolved, the components
// built and made ready, the run directory written, the throughput roof measured.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "checkpoint/checkpoint_writer.hpp"
#include "loom/core/runtime.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"
#include "train/checkpointing.hpp"
#include "train/components.hpp"
#include "train/progress.hpp"
#include "train/run_directory.hpp"
#include "train/train_state.hpp"
#include "train/world.hpp"

namespace loom::training {

struct Run {
  Value config;     // resolved
  Options trainer;  // its `trainer` section
  std::uint64_t seed = 0;
  std::int64_t num_steps = 0;
  std::int64_t batch_size = 0;   // sequences per step
  std::int64_t micro_size = 0;   // sequences per forward/backward pass; divides batch_size
  std::int64_t seq_len = 0;      // the model's context
  std::shared_ptr<World> world;  // the ranks of the run (one without mpirun)
  RunDirectory directory;        // rank 0's; the other ranks write no files
  RunComponents components;
  TrainState state;
  double flops_per_token = 0;  // the model's, at seq_len
  double peak_flops = 0;       // what MFU is relative to
  CheckpointSettings checkpoint;
  std::unique_ptr<checkpoint::CheckpointWriter> checkpoints;
  std::int64_t resumed_from = -1;  // the checkpoint's step when the run resumed
  bool finished = false;           // resumed at its last step with its final weights written: nothing to do
};

// Sets up the run runtime's config describes and prints its header; resumes it from a checkpoint
// as trainer.resume says (train/resume.hpp). Throws UserError for a bad config or data, a run
// directory that holds a run it may not continue, or a checkpoint it cannot continue from.
// `report_error` prints an error once in a data-parallel run (World::together()).
Run set_up_run(Runtime& runtime, ProgressPrinter& progress, std::function<void(const Error&)> report_error = {});

}  // namespace loom::training
