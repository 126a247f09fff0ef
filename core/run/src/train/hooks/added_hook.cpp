#include "train/hooks/run_hooks.hpp"

namespace loom::training {

void AddedHook::after_step(const StepOutcome& step) {
  const Run& run = s_.run;
  const StepResult& result = *step.result;
  StepInfo info;
  info.step = step.step;
  info.num_steps = run.num_steps;
  info.loss = result.loss;
  info.lr = result.lr;
  info.grad_norm = result.grad_norm;
  info.skipped = result.skipped;
  info.metrics = s_.named("train/", result.metrics);
  info.rank = run.world->rank();
  info.ranks = run.world->size();
  info.run_dir = run.directory.path().string();
  info.checkpoint_dir = run.checkpoint.dir.string();
  info.last_checkpoint_step = checkpoints_.last_saved();
  hook_(info);
}

}  // namespace loom::training
