// The `lr_schedule` kind: the learning rate as a function of the step.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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

  // Called once before a run of `num_steps` steps starts. Throws UserError for options that no
  // run can satisfy (the trainer stops with it); returns a line for each option the schedule
  // adapts to fit this run, such as a warmup clamped to a run shortened from the command line
  // (the trainer prints each as a warning). The default asks for the first step's rate and
  // reports nothing.
  virtual std::vector<std::string> check(std::int64_t num_steps) const {
    learning_rate(0, num_steps, 1.0);
    return {};
  }
};

}  // namespace loom
