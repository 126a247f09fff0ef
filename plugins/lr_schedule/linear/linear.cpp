// lr_schedule `linear`: linear decay from the peak to min_lr_ratio * peak (Levanter's
// lr_schedule: linear, optax.linear_schedule).
#include <algorithm>
#include <loom/kinds/lr_schedule.hpp>
#include <loom/lr_schedule_cycles.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <utility>

namespace {

class Linear final : public loom::CycledLrSchedule {
 public:
  using CycledLrSchedule::CycledLrSchedule;

 protected:
  double decay_rate(const DecayPoint& p) const override {
    // An empty decay leaves the rate at the peak, as optax's linear_schedule does for 0 steps.
    if (p.decay_steps == 0) return p.peak;
    const double t = static_cast<double>(std::min(p.count, p.decay_steps)) / static_cast<double>(p.decay_steps);
    return p.peak + (p.min_lr - p.peak) * t;
  }
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  loom::CycledLrSchedule::declare_options(options, {});
  registrar.add<loom::LrSchedule>(
      {.name = "linear",
       .description = "linear warmup, then linear decay to min_lr_ratio * peak",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<Linear>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
