// The `lion` optimizer: EvoLved Sign Momentum (Chen et al., 2023, "Symbolic Discovery of
// Optimization Algorithms", Algorithm 2):
//   c = beta1 m + (1 - beta1) g
//   p = p - lr (sign(c) + wd p)
//   m = beta2 m + (1 - beta2) g
// Every coordinate moves by exactly lr (plus the decay), so Lion wants a smaller learning rate
// and a larger weight decay than AdamW; it keeps one moment instead of two. Each parameter is
// updated in one fused pass over its value, gradient and moment.
#include <cmath>
#include <cstdint>
#include <loom/elementwise_optimizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

struct LionStep {
  float lr;
  float weight_decay;  // 0 for parameters the mask leaves undecayed
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
};

// The paper's expressions as written, each operation rounded once (the plugin is compiled with
// -ffp-contract=off); the momentum update is one fused multiply-add, as PyTorch's add(alpha).
template <bool kDecay>
void lion_pass(float* __restrict p, const float* __restrict g, float* __restrict m, std::int64_t n, const LionStep& s) {
  const float lr = s.lr, wd = s.weight_decay, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2,
              c2 = s.one_minus_beta2;
  for (std::int64_t i = 0; i < n; ++i) {
    const float pi = p[i], gi = g[i], mi = m[i];
    const float c = b1 * mi + c1 * gi;
    // sign(0) = 0, as in the paper's (and PyTorch's) sign.
    float update = static_cast<float>(c > 0.0f) - static_cast<float>(c < 0.0f);
    if constexpr (kDecay) update = update + wd * pi;
    p[i] = pi - lr * update;
    m[i] = std::fma(gi, c2, mi * b2);
  }
}

class Lion final : public loom::ElementwiseOptimizer {
 public:
  Lion(const loom::Options& options, loom::ExecutionContext& execution)
      : ElementwiseOptimizer("lion", execution, {"exp_avg"}),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        weight_decay_(options.get<double>("weight_decay")) {}

 private:
  void begin_step(double lr, std::int64_t) override { lr_ = static_cast<float>(lr); }

  void update_chunk(const Chunk& c) const override {
    const bool decay = c.weight_decay && weight_decay_ != 0.0;
    const LionStep s{lr_,
                     static_cast<float>(decay ? weight_decay_ : 0.0),
                     static_cast<float>(beta1_),
                     static_cast<float>(1.0 - beta1_),
                     static_cast<float>(beta2_),
                     static_cast<float>(1.0 - beta2_)};
    if (decay)
      lion_pass<true>(c.parameter, c.grad, c.slots[0], c.size, s);
    else
      lion_pass<false>(c.parameter, c.grad, c.slots[0], c.size, s);
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
