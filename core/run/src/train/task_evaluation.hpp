// trainer.eval_tasks: benchmark tasks (`loom eval`'s, docs/evaluation.md) scored during training
// every trainer.steps_per_task_eval steps and at the end, logged as eval/<task>/<metric>.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "loom/options.hpp"
#include "loom/run/eval.hpp"
#include "train/components.hpp"

namespace loom::training {

class TaskEvaluation {
 public:
  // Reads the task files (trainer.eval_tasks, trainer.eval_task_limit documents each) and encodes
  // their documents for the model now (eval::encode_task), so that a bad file, or a document the
  // model cannot score (longer than its context), fails before the first step.
  TaskEvaluation(const RunComponents& components, const Options& trainer);

  bool enabled() const { return !tasks_.empty(); }
  // Whether `step` (completed steps) is one to score at, before the last.
  bool due(std::int64_t step) const { return enabled() && every_ > 0 && step % every_ == 0; }
  // Scores every task with the model as it stands: the scalars (eval/<task>/acc, ...) and a line
  // for the progress ("hellaswag acc 0.2500 acc_norm 0.3000, ...").
  std::pair<std::vector<std::pair<std::string, double>>, std::string> run();

 private:
  // What stands for an empty context: the run's document separator.
  std::int32_t prefix() const;
  const RunComponents& components_;
  std::vector<eval::Task> tasks_;
  std::int64_t every_ = 0;
  eval::EvalOptions options_;
};

}  // namespace loom::training
