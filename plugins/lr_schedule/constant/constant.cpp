// lr_schedule `constant`: the peak rate after the warmup (Levanter's lr_schedule: constant).
#include <loom/kinds/lr_schedule.hpp>
#include <loom/lr_schedule_cycles.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <utility>

namespace {

class Constant final : public loom::CycledLrSchedule {
 public:
  using CycledLrSchedule::CycledLrSchedule;

 protected:
  double decay_rate(const DecayPoint& p) const override { return p.peak; }
};

void register_components(loom::Registrar& registrar) {
  // The cycle options are accepted, although only `warmup` changes a constant rate, so that a
  // config switches schedules by changing `type` alone.
  loom::OptionSchema options;
  loom::CycledLrSchedule::declare_options(options, {});
  registrar.add<loom::LrSchedule>(
      {.name = "constant",
       .description = "the peak rate after a linear warmup",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<Constant>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
