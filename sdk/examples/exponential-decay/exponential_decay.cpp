// An lr_schedule plugin: the learning rate decays by `decay_rate` every `decay_steps` steps,
//   lr(step) = peak * decay_rate ^ (step / decay_steps)
// continuously (or in whole steps when `staircase` is set), as in TensorFlow's ExponentialDecay.
#include <cmath>
#include <loom/kinds/lr_schedule.hpp>
#include <loom/plugin.hpp>
#include <memory>

namespace {

class ExponentialDecay final : public loom::LrSchedule {
 public:
  explicit ExponentialDecay(const loom::Options& options)
      : decay_rate_(options.get<double>("decay_rate")),
        decay_steps_(options.get<std::int64_t>("decay_steps")),
        staircase_(options.get<bool>("staircase")) {}

  double learning_rate(std::int64_t step, std::int64_t /*num_steps*/, double peak) const override {
    double exponent = static_cast<double>(step) / static_cast<double>(decay_steps_);
    if (staircase_) exponent = std::floor(exponent);
    return peak * std::pow(decay_rate_, exponent);
  }

 private:
  double decay_rate_;
  std::int64_t decay_steps_;
  bool staircase_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.number("decay_rate", 0.5, "Factor the learning rate is multiplied by every `decay_steps` steps.")
      .min(0.0, /*inclusive=*/false)
      .max(1.0);
  s.integer("decay_steps", 1000, "Steps over which the rate decays by one factor of `decay_rate`.").min(1);
  s.boolean("staircase", false, "Decay in whole steps of `decay_steps` instead of continuously.");
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::LrSchedule>(
      {.name = "exponential",
       .description = "exponential decay: peak * decay_rate^(step / decay_steps)",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<ExponentialDecay>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
