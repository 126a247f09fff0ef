// The `adamw` optimizer: Adam (Kingma & Ba, 2015) with decoupled weight decay (Loshchilov &
// Hutter, 2019), the update of torch.optim.AdamW with Levanter's AdamConfig defaults.
//
// Each parameter is updated in one fused pass that reads the parameter, its gradient and both
// moments once and writes the parameter and the moments once: the step is bound by memory
// bandwidth, so every extra pass (or temporary) would cost as much as the arithmetic. The pass
// is elementwise, so its result does not depend on how parallel_for splits it.
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

// The per-step constants of the update, rounded to float once (as PyTorch does with its Python
// scalars) so that the inner loop is pure float arithmetic.
struct AdamWStep {
  float decay;  // 1 - lr * weight_decay
  float beta1, one_minus_beta1;
  float beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float epsilon;
  float step_size;  // lr / (1 - beta1^t)
};

// One fused pass over n elements, in torch.optim.AdamW's order of operations:
//   p <- p * (1 - lr wd)                                   (only for decayed parameters)
//   m <- beta1 m + (1 - beta1) g
//   v <- beta2 v + (1 - beta2) g^2
//   p <- p - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The plugin is compiled with -ffp-contract=off, so the roundings are the ones written here; the
// one fused multiply-add is where PyTorch's vectorised add(alpha) has one too. That keeps loom
// within a few ulps of PyTorch and independent of what the compiler chooses to fuse.
template <bool kDecay>
void adamw_pass(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                std::int64_t n, const AdamWStep& s) {
  const float decay = s.decay, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2, c2 = s.one_minus_beta2;
  const float bc2_sqrt = s.bias_correction2_sqrt, eps = s.epsilon, neg_step_size = -s.step_size;
  for (std::int64_t i = 0; i < n; ++i) {
    float pi = p[i];
    if constexpr (kDecay) pi *= decay;
    const float gi = g[i];
    const float mi = std::fma(gi, c1, m[i] * b1);
    const float vi = v[i] * b2 + (c2 * gi) * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + neg_step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
  }
}

class AdamW final : public loom::Optimizer {
 public:
  AdamW(const loom::Options& options, loom::ExecutionContext& execution)
      : execution_(execution),
        learning_rate_(options.get<double>("learning_rate")),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        epsilon_(options.get<double>("epsilon")),
        weight_decay_(options.get<double>("weight_decay")),
        max_grad_norm_(opt::read_max_grad_norm(options)) {}

  double learning_rate() const override { return learning_rate_; }
  double max_grad_norm() const override { return max_grad_norm_; }

  void init(const std::vector<loom::OptimizerParameter>& parameters) override {
    opt::check_init("adamw", initialised_, parameters);
    for (const auto& op : parameters) {
      const loom::Shape& shape = op.parameter->shape();
      slots_.push_back({op.parameter, op.weight_decay, loom::Tensor::zeros(shape), loom::Tensor::zeros(shape)});
    }
    initialised_ = true;
  }

  void step(double lr, std::int64_t step) override {
    opt::check_step("adamw", initialised_, lr, step);
    // Bias corrections from the trainer's step count, in double as PyTorch computes them.
    const double t = static_cast<double>(step) + 1.0;
    const double bias_correction1 = 1.0 - std::pow(beta1_, t);
    const double bias_correction2 = 1.0 - std::pow(beta2_, t);
    AdamWStep s{};
    s.decay = static_cast<float>(1.0 - lr * weight_decay_);
    s.beta1 = static_cast<float>(beta1_);
    s.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    s.beta2 = static_cast<float>(beta2_);
    s.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    s.epsilon = static_cast<float>(epsilon_);
    s.step_size = static_cast<float>(lr / bias_correction1);

    opt::for_each_gradient("adamw", slots_, [&](Slot& slot, const loom::Tensor& grad) {
      float* p = slot.parameter->data().data<float>();
      const float* g = grad.data<float>();
      float* m = slot.exp_avg.data<float>();
      float* v = slot.exp_avg_sq.data<float>();
      const bool decay = slot.weight_decay && weight_decay_ != 0.0;
      opt::parallel_chunks(execution_, grad.numel(), [&](std::int64_t begin, std::int64_t end) {
        if (decay)
          adamw_pass<true>(p + begin, g + begin, m + begin, v + begin, end - begin, s);
        else
          adamw_pass<false>(p + begin, g + begin, m + begin, v + begin, end - begin, s);
      });
    });
  }

  // The live moment tensors, not copies: write them out before the next step().
  std::vector<std::pair<std::string, loom::Tensor>> state() const override {
    std::vector<std::pair<std::string, loom::Tensor>> out;
    out.reserve(2 * slots_.size());
    for (const Slot& slot : slots_) {
      out.emplace_back(opt::key("exp_avg", *slot.parameter), slot.exp_avg);
      out.emplace_back(opt::key("exp_avg_sq", *slot.parameter), slot.exp_avg_sq);
    }
    return out;
  }

  // Checks everything before copying anything, so a bad checkpoint leaves the state untouched.
  void load_state(const std::vector<std::pair<std::string, loom::Tensor>>& saved) override {
    opt::StateMap expected;
    for (const Slot& slot : slots_) {
      expected.emplace(opt::key("exp_avg", *slot.parameter), &slot.exp_avg);
      expected.emplace(opt::key("exp_avg_sq", *slot.parameter), &slot.exp_avg_sq);
    }
    opt::load_all("adamw", initialised_, expected, saved, "'exp_avg/<parameter>' and 'exp_avg_sq/<parameter>'");
  }

 private:
  struct Slot {
    loom::Parameter* parameter;
    bool weight_decay;
    loom::Tensor exp_avg;     // first moment m
    loom::Tensor exp_avg_sq;  // second moment v
  };

  loom::ExecutionContext& execution_;
  double learning_rate_, beta1_, beta2_, epsilon_, weight_decay_, max_grad_norm_;
  std::vector<Slot> slots_;
  bool initialised_ = false;
};

loom::OptionSchema adamw_options() {
  loom::OptionSchema s;
  s.number("learning_rate", 6e-4, "Peak learning rate; the lr_schedule shapes it.").min(0.0);
  s.number("beta1", 0.9, "Decay rate of the first-moment (mean) estimate.").min(0.0).max(1.0, false);
  s.number("beta2", 0.95, "Decay rate of the second-moment (uncentred variance) estimate.").min(0.0).max(1.0, false);
  s.number("epsilon", 1e-8, "Added to the bias-corrected sqrt of the second moment.").min(0.0, false);
  s.number("weight_decay", 0.1,
           "Decoupled weight decay: p -= lr * weight_decay * p each step, on parameters the weight-decay mask "
           "selects.")
      .min(0.0);
  opt::declare_max_grad_norm(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "adamw",
       .description = "Adam with decoupled weight decay (torch.optim.AdamW; Levanter AdamConfig defaults)",
       .version = "1.0.0",
       .options = adamw_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<AdamW>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
