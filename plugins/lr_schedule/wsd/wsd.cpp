// lr_schedule `wsd`: warmup-stable-decay ("trapezoidal"): a linear warmup, the peak held, and a
// short decay at the end of each cycle (MiniCPM, Hu et al. 2024; Hägele et al., "Scaling Laws and
// Compute-Optimal Training Beyond Fixed Training Durations", 2024). In Levanter this is any
// schedule with `decay` set; here `decay` defaults to 0.2 of the cycle and `decay_shape` picks
// the decay's form, 1-sqrt being the one Hägele et al. found best.
#include <algorithm>
#include <cmath>
#include <loom/kinds/lr_schedule.hpp>
#include <loom/lr_schedule_cycles.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <numbers>
#include <string>
#include <utility>

namespace {

enum class Shape { linear, one_minus_sqrt, cosine };

Shape parse_shape(const std::string& s) {
  if (s == "1-sqrt") return Shape::one_minus_sqrt;
  if (s == "cosine") return Shape::cosine;
  return Shape::linear;  // the schema allows nothing else
}

class Wsd final : public loom::CycledLrSchedule {
 public:
  explicit Wsd(const loom::Options& o) : CycledLrSchedule(o), shape_(parse_shape(o.get<std::string>("decay_shape"))) {}

 protected:
  double decay_rate(const DecayPoint& p) const override {
    if (p.decay_steps == 0) return p.peak;  // no decay phase: the peak holds
    const double t = static_cast<double>(std::min(p.count, p.decay_steps)) / static_cast<double>(p.decay_steps);
    double remaining = 0.0;  // of the way from min_lr to the peak
    switch (shape_) {
      case Shape::linear:
        remaining = 1.0 - t;
        break;
      case Shape::one_minus_sqrt:
        remaining = 1.0 - std::sqrt(t);
        break;
      case Shape::cosine:
        remaining = 0.5 * (1.0 + std::cos(std::numbers::pi * t));
        break;
    }
    return p.min_lr + (p.peak - p.min_lr) * remaining;
  }

 private:
  Shape shape_;
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  loom::CycledLrSchedule::declare_options(options, {.warmup = 0.01, .decay = 0.2, .min_lr_ratio = 0.1});
  options.string("decay_shape", "linear", "Form of the decay: linear, 1-sqrt (1 - sqrt(t)) or cosine.")
      .one_of({"linear", "1-sqrt", "cosine"});
  registrar.add<loom::LrSchedule>(
      {.name = "wsd",
       .description = "warmup-stable-decay: linear warmup, the peak held, a short decay at the end",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<Wsd>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
