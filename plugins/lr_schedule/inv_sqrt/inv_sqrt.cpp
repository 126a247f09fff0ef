// lr_schedule `inv_sqrt`: the inverse square-root decay of "Attention Is All You Need" and T5, as
// Levanter writes it:
//   rate = max(peak * min(1, 1 / sqrt(max(count + warmup, 1) / timescale)), min_lr_ratio * peak)
// where count is the step within the decay phase and warmup this cycle's warmup steps: the peak
// holds until count + warmup reaches `timescale`, then falls as 1 / sqrt(step).
#include <algorithm>
#include <cmath>
#include <loom/kinds/lr_schedule.hpp>
#include <loom/lr_schedule_cycles.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <utility>

namespace {

class InvSqrt final : public loom::CycledLrSchedule {
 public:
  explicit InvSqrt(const loom::Options& o) : CycledLrSchedule(o), timescale_(o.get<double>("timescale")) {}

 protected:
  double decay_rate(const DecayPoint& p) const override {
    const double t = std::max(static_cast<double>(p.count + p.warmup_steps), 1.0) / timescale_;
    const double factor = std::min(1.0, 1.0 / std::sqrt(t));
    return std::max(p.peak * factor, p.min_lr);
  }

 private:
  double timescale_;
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  loom::CycledLrSchedule::declare_options(options, {});
  options.number("timescale", 10000.0, "Steps (counting the warmup) after which the rate falls as 1 / sqrt(step).")
      .min(0.0, /*inclusive=*/false);
  registrar.add<loom::LrSchedule>(
      {.name = "inv_sqrt",
       .description = "linear warmup, then inverse square-root decay (floored at min_lr_ratio * peak)",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<InvSqrt>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
