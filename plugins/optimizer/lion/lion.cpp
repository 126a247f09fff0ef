// The `lion` optimizer: EvoLved Sign Momentum (Chen et al., 2023, "Symbolic Discovery of
// Optimization Algorithms", Algorithm 2):
//   c = beta1 m + (1 - beta1) g
//   p = p - lr (sign(c) + wd p)
//   m = beta2 m + (1 - beta2) g
// Every coordinate moves by exactly lr (plus the decay), so Lion wants a smaller learning rate
// and a larger weight decay than AdamW; it keeps one moment instead of two. Each parameter is
// updated in one fused pass over its value, gradient and moment: the SDK's UpdateRule::lion
// (training_kernels.hpp: the paper's expressions as written, each operation rounded once, compiled
// with -ffp-contract=off), which the SDK base runs on the host and a device backend as its kernel.
#include <cmath>
#include <cstdint>
#include <loom/elementwise_optimizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

class Lion final : public loom::ElementwiseOptimizer {
 public:
  Lion(const loom::Options& options, loom::ExecutionContext& execution)
      : ElementwiseOptimizer("lion", execution, {"exp_avg"}),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        weight_decay_(options.get<double>("weight_decay")) {}

 private:
  void begin_step(double lr, std::int64_t) override { lr_ = static_cast<float>(lr); }

  std::optional<loom::ElementwiseUpdate> update_rule(bool weight_decay, bool) const override {
    loom::ElementwiseUpdate u;
    u.rule = loom::UpdateRule::lion;
    u.decay = weight_decay && weight_decay_ != 0.0;
    u.lr = lr_;
    u.weight_decay = static_cast<float>(u.decay ? weight_decay_ : 0.0);
    u.beta1 = static_cast<float>(beta1_);
    u.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    u.beta2 = static_cast<float>(beta2_);
    u.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    return u;
  }

  double beta1_, beta2_, weight_decay_;
  float lr_ = 0.0f;
};

// Defaults: the paper's betas, and its advice for moving from AdamW (Section 5: a learning rate
// 3-10x smaller and a weight decay 3-10x larger, keeping lr * wd) applied at 10x to loom's
// AdamW defaults (6e-4, 0.1): lr 6e-5 and weight decay 1.0, the same lr * wd = 6e-5.
loom::OptionSchema lion_options() {
  loom::OptionSchema s;
  s.number("beta1", 0.9, "Interpolation between momentum and gradient for the update's sign.").min(0.0).max(1.0, false);
  s.number("beta2", 0.99, "Decay rate of the momentum.").min(0.0).max(1.0, false);
  s.number("weight_decay", 1.0,
           "Decoupled weight decay: p -= lr * weight_decay * p each step, on parameters the weight-decay mask "
           "selects.")
      .min(0.0);
  s.section_default("learning_rate", 6e-5);  // every coordinate moves by lr
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>({.name = "lion",
                                  .description = "Lion, the sign-momentum optimizer of Chen et al. (2023)",
                                  .version = "1.1.0",
                                  .options = lion_options()},
                                 [](const loom::Options& options, const loom::CreateContext& context) {
                                   return std::make_unique<Lion>(options, context.execution());
                                 });
}

}  // namespace

LOOM_PLUGIN(register_components)
