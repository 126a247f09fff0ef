// The `lr_schedule` kind: the learning rate as a function of the step.
#pragma once

#include <cstdint>
#include <string_view>

#include "loom/component.hpp"

namespace loom {

class LrSchedule : public Component {
 public:
  static constexpr std::string_view kind = "lr_schedule";
  ~LrSchedule() override;

  // The learning rate at `step` (0-based) of a run of `num_steps` steps whose peak rate is
  // `peak`. Must be a pure function of its arguments (a resumed run recomputes it) and safe to
  // call from any thread.
  virtual double learning_rate(std::int64_t step, std::int64_t num_steps, double peak) const = 0;
};

}  // namespace loom
