// Levanter's skip-step rule: see SkipStepRule in loom/run/trainer.hpp.
#include <algorithm>
#include <cmath>
#include <string>

#include "loom/error.hpp"
#include "loom/run/trainer.hpp"

namespace loom {

SkipStepRule::SkipStepRule(std::int64_t window, double sigma)
    : capacity_(static_cast<std::size_t>(window) + 1), sigma_(sigma) {}

bool SkipStepRule::should_skip(double loss, double grad_norm) {
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) return true;
  bool skip = false;
  const std::size_t min_points = std::max<std::size_t>(2, (capacity_ - 1) / 2);
  if (losses_.size() >= min_points) skip = loss > threshold(losses_) || grad_norm > threshold(norms_);
  push(losses_, loss);
  push(norms_, grad_norm);
  return skip;
}

void SkipStepRule::restore(const std::vector<double>& losses, const std::vector<double>& grad_norms) {
  if (losses.size() != grad_norms.size() || losses.size() > capacity_)
    throw UserError("the checkpoint's skip-bad-steps window holds " + std::to_string(losses.size()) + " losses and " +
                    std::to_string(grad_norms.size()) + " gradient norms; trainer.skip_step_window " +
                    std::to_string(capacity_ - 1) + " keeps up to " + std::to_string(capacity_) +
                    " of each (was trainer.skip_step_window changed?)");
  losses_.clear();
  norms_.clear();
  for (std::size_t i = 0; i < losses.size(); ++i)
    if (std::isfinite(losses[i]) && std::isfinite(grad_norms[i])) {
      losses_.push_back(losses[i]);
      norms_.push_back(grad_norms[i]);
    }
}

double SkipStepRule::threshold(const std::deque<double>& xs) const {
  double mean = 0;
  for (double x : xs) mean += x;
  mean /= static_cast<double>(xs.size());
  double var = 0;
  for (double x : xs) var += (x - mean) * (x - mean);
  var /= static_cast<double>(xs.size());
  return mean + sigma_ * std::max(std::sqrt(var), 1e-6);
}

void SkipStepRule::push(std::deque<double>& xs, double x) {
  xs.push_back(x);
  if (xs.size() > capacity_) xs.pop_front();
}

}  // namespace loom
