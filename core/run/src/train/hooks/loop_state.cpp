#include <chrono>

#include "train/hooks/hook.hpp"

namespace loom::training {

LoopState::LoopState(Run& run, ProgressPrinter& progress, TrainSummary& summary)
    : run(run), progress(progress), summary(summary), views(run), start(Clock::now()) {
  const RunComponents& c = run.components;
  // The first strategy that runs the model on every rank together names it.
  for (const auto& strategy : c.strategies)
    if (const char* name = strategy->runs_model_together(); name && !together) {
      together = true;
      together_name = name;
    }
}

double LoopState::elapsed() const {
  return run.state.interval.elapsed_before + std::chrono::duration<double>(Clock::now() - start).count();
}

void LoopState::log(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) const {
  for (auto& t : run.components.trackers) t->log_scalars(step, scalars);
}

void LoopState::flush_trackers() const {
  for (auto& t : run.components.trackers) t->flush();
}

std::vector<std::pair<std::string, double>> LoopState::named(const std::string& prefix,
                                                             const std::vector<double>& values) const {
  const std::vector<std::string> names = run.components.objective->metric_names();
  std::vector<std::pair<std::string, double>> out;
  for (std::size_t i = 0; i < names.size() && i < values.size(); ++i) out.emplace_back(prefix + names[i], values[i]);
  return out;
}

}  // namespace loom::training
