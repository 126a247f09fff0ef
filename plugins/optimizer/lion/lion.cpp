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
#include <loom/kinds/optimizer.hpp>
#include <loom/optimizer_state.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace opt = loom::optimizer_state;

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

class Lion final : public loom::Optimizer {
 public:
  Lion(const loom::Options& options, loom::ExecutionContext& execution)
      : execution_(execution),
        learning_rate_(options.get<double>("learning_rate")),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        weight_decay_(options.get<double>("weight_decay")),
        max_grad_norm_(opt::read_max_grad_norm(options)) {}

  double learning_rate() const override { return learning_rate_; }
  double max_grad_norm() const override { return max_grad_norm_; }

  void init(const std::vector<loom::OptimizerParameter>& parameters) override {
    opt::check_init("lion", initialised_, parameters);
    for (const auto& op : parameters) {
      slots_.push_back({op.parameter, op.weight_decay, loom::Tensor::zeros(op.parameter->shape())});
    }
    initialised_ = true;
  }

  void step(double lr, std::int64_t step) override {
    opt::check_step("lion", initialised_, lr, step);
    opt::for_each_gradient("lion", slots_, [&](Slot& slot, const loom::Tensor& grad) {
      const bool decay = slot.weight_decay && weight_decay_ != 0.0;
      const LionStep s{static_cast<float>(lr),     static_cast<float>(decay ? weight_decay_ : 0.0),
                       static_cast<float>(beta1_), static_cast<float>(1.0 - beta1_),
                       static_cast<float>(beta2_), static_cast<float>(1.0 - beta2_)};
      float* p = slot.parameter->data().data<float>();
      const float* g = grad.data<float>();
      float* m = slot.exp_avg.data<float>();
      opt::parallel_chunks(execution_, grad.numel(), [&](std::int64_t begin, std::int64_t end) {
        if (decay)
          lion_pass<true>(p + begin, g + begin, m + begin, end - begin, s);
        else
          lion_pass<false>(p + begin, g + begin, m + begin, end - begin, s);
      });
    });
  }

  // The live moment tensors, not copies: write them out before the next step().
  std::vector<std::pair<std::string, loom::Tensor>> state() const override {
    std::vector<std::pair<std::string, loom::Tensor>> out;
    out.reserve(slots_.size());
    for (const Slot& slot : slots_) out.emplace_back(opt::key("exp_avg", *slot.parameter), slot.exp_avg);
    return out;
  }

  // Checks everything before copying anything, so a bad checkpoint leaves the state untouched.
  void load_state(const std::vector<std::pair<std::string, loom::Tensor>>& saved) override {
    opt::StateMap expected;
    for (const Slot& slot : slots_) expected.emplace(opt::key("exp_avg", *slot.parameter), &slot.exp_avg);
    opt::load_all("lion", initialised_, expected, saved, "'exp_avg/<parameter>'");
  }

 private:
  struct Slot {
    loom::Parameter* parameter;
    bool weight_decay;
    loom::Tensor exp_avg;  // the momentum m
  };

  loom::ExecutionContext& execution_;
  double learning_rate_, beta1_, beta2_, weight_decay_, max_grad_norm_;
  std::vector<Slot> slots_;
  bool initialised_ = false;
};

// Defaults: the paper's betas, and its advice for moving from AdamW (Section 5: a learning rate
// 3-10x smaller and a weight decay 3-10x larger, keeping lr * wd) applied at 10x to loom's
// AdamW defaults (6e-4, 0.1): lr 6e-5 and weight decay 1.0, the same lr * wd = 6e-5.
loom::OptionSchema lion_options() {
  loom::OptionSchema s;
  s.number("learning_rate", 6e-5, "Peak learning rate (every coordinate moves by lr); the lr_schedule shapes it.")
      .min(0.0);
  s.number("beta1", 0.9, "Interpolation between momentum and gradient for the update's sign.").min(0.0).max(1.0, false);
  s.number("beta2", 0.99, "Decay rate of the momentum.").min(0.0).max(1.0, false);
  s.number("weight_decay", 1.0,
           "Decoupled weight decay: p -= lr * weight_decay * p each step, on parameters the weight-decay mask "
           "selects.")
      .min(0.0);
  opt::declare_max_grad_norm(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>({.name = "lion",
                                  .description = "Lion, the sign-momentum optimizer of Chen et al. (2023)",
                                  .version = "1.0.0",
                                  .options = lion_options()},
                                 [](const loom::Options& options, const loom::CreateContext& context) {
                                   return std::make_unique<Lion>(options, context.execution());
                                 });
}

}  // namespace

LOOM_PLUGIN(register_components)
