// lr_schedule `cosine`: half a cosine from the peak down to min_lr_ratio * peak (Levanter's
// default lr_schedule, optax.cosine_decay_schedule with alpha = min_lr_ratio; Loshchilov &
// Hutter, "SGDR", 2017).
#include <algorithm>
#include <cmath>
#include <loom/kinds/lr_schedule.hpp>
#include <loom/lr_schedule_cycles.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <numbers>
#include <utility>

namespace {

class Cosine final : public loom::CycledLrSchedule {
 public:
  using CycledLrSchedule::CycledLrSchedule;

 protected:
  double decay_rate(const DecayPoint& p) const override {
    // An empty decay leaves the rate at the peak (optax would refuse 0 steps; Levanter can't get there).
    if (p.decay_steps == 0) return p.peak;
    const double t = static_cast<double>(std::min(p.count, p.decay_steps)) / static_cast<double>(p.decay_steps);
    const double alpha = min_lr_ratio();
    return p.peak * ((1.0 - alpha) * 0.5 * (1.0 + std::cos(std::numbers::pi * t)) + alpha);
  }
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  loom::CycledLrSchedule::declare_options(options, {});
  registrar.add<loom::LrSchedule>(
      {.name = "cosine",
       .description = "linear warmup, then cosine decay to min_lr_ratio * peak",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<Cosine>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
