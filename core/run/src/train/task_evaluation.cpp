#include "train/task_evaluation.hpp"

#include <iomanip>
#include <sstream>

#include "loom/error.hpp"

namespace loom::training {

TaskEvaluation::TaskEvaluation(const RunComponents& components, const Options& trainer)
    : components_(components), every_(trainer.get<std::int64_t>("steps_per_task_eval")) {
  const auto entries = trainer.get<std::vector<std::string>>("eval_tasks");
  if (entries.empty()) return;
  options_.scorer.batch_size = trainer.get<std::int64_t>("eval_task_batch_size");
  with_context("while reading trainer.eval_tasks", [&] {
    for (const auto& spec : eval::parse_task_specs(entries, "eval_data"))
      tasks_.push_back(eval::load_task(spec, trainer.get<std::int64_t>("eval_task_limit")));
    // Every document against this model now (its tokenizer, its context), so that one it cannot
    // score stops the run before its first step, not at an evaluation after hours of training.
    for (const auto& task : tasks_)
      eval::encode_task(task, *components_.tokenizer, prefix(), components_.model->max_seq_len());
  });
}

std::int32_t TaskEvaluation::prefix() const {
  return document_boundary(*components_.tokenizer, components_.dataset->separator_ends_documents()).separator.back();
}

std::pair<std::vector<std::pair<std::string, double>>, std::string> TaskEvaluation::run() {
  const auto results = eval::evaluate_tasks(*components_.model, *components_.backend, *components_.tokenizer, prefix(),
                                            tasks_, options_);
  std::vector<std::pair<std::string, double>> scalars;
  std::ostringstream line;
  line << std::fixed << std::setprecision(4);
  for (const auto& r : results) {
    line << (line.tellp() > 0 ? ", " : "") << r.name;
    for (const auto& m : r.metrics) {
      scalars.emplace_back("eval/" + r.name + "/" + m.name, m.value);
      line << " " << m.name << " " << m.value;
    }
  }
  return {scalars, line.str()};
}

}  // namespace loom::training
