#include <exception>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

TaskEvaluationHook::TaskEvaluationHook(LoopState& s) : Hook(0), s_(s) {
  // Every rank reads trainer.eval_tasks' files: an error all of them meet (a broken file) is
  // printed once, by rank 0, one of a single rank by that rank.
  s.run.world->together([&] { tasks_.emplace(s.run.components, s.run.trainer); });
  if (s.together && tasks_->enabled())
    s.progress.say(std::string("note: trainer.eval_tasks is not run under ") + s.together_name +
                   " in this build; score "
                   "the final weights with `loom eval " +
                   s.run.directory.path().string() + " --tasks ...`");
}

void TaskEvaluationHook::evaluate(std::int64_t step) {
  // (Not under FSDP, whose units every rank gathers together: the set-up says so.)
  if (!tasks_->enabled() || !s_.run.world->is_primary() || s_.together || s_.task_failure) return;
  try {
    const auto [scalars, line] =
        s_.views.with_average([&] { return s_.views.with_adapters([&] { return tasks_->run(); }); });
    s_.log(step, scalars);
    s_.progress.say("tasks at step " + std::to_string(step) + ": " + line);
  } catch (const std::exception& e) {
    s_.task_failure = std::current_exception();
    s_.progress.say("tasks at step " + std::to_string(step) + " failed: " + e.what() +
                    " (no further task evaluation; the run trains on and saves its weights, then stops with this "
                    "error)");
  }
}

}  // namespace loom::training
