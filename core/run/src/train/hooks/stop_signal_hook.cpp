#include "checkpoint/checkpoint_store.hpp"
#include "train/hooks/run_hooks.hpp"

namespace loom::training {

StopSignalHook::StopSignalHook(LoopState& s, Checkpoints& checkpoints)
    : Hook(1),
      s_(s),
      checkpoints_(checkpoints),
      signals_(s.run.world->rank(), s.run.world->size(), s.run.world->same_host_peers()) {}

void StopSignalHook::after_step(const StepOutcome&) {
  World& world = *s_.run.world;
  const std::int64_t step = s_.run.state.step;
  if ((s_.stopped_by = world.max_over_ranks(signals_.requested())) == 0) return;
  // Every rank is here: the checkpoint will be written (one process said so at the signal).
  const bool save = checkpoints_.last_saved() != step;
  if (world.size() > 1)
    s_.progress.say(std::string(signal_name(s_.stopped_by)) + ": the ranks stop after step " + std::to_string(step) +
                    (save ? ", saving a checkpoint of it" : ""));
  if (save) checkpoints_.save(/*wait=*/true);
}

void StopSignalHook::final() {
  checkpoints_.finish();
  s_.flush_trackers();
  const Run& run = s_.run;
  TrainSummary& summary = s_.summary;
  summary.steps = run.state.step;
  summary.skipped_steps = run.state.skipped_steps;
  summary.stopped_by_signal = s_.stopped_by;
  summary.wall_seconds = s_.elapsed();
  s_.progress.say("stopped by " + std::string(signal_name(s_.stopped_by)) + " after step " +
                  std::to_string(run.state.step) + " of " + std::to_string(run.num_steps) + "; checkpoint " +
                  (run.checkpoint.dir / checkpoint::CheckpointStore::dir_name(run.state.step)).string() +
                  " holds it: run the same command again to continue (trainer.resume: auto)");
}

}  // namespace loom::training
