// The `adamw` optimizer: Adam (Kingma & Ba, 2015) with decoupled weight decay (Loshchilov &
// Hutter, 2019), the update of torch.optim.AdamW with Levanter's AdamConfig defaults.
//
// Each parameter is updated in one fused pass that reads the parameter, its gradient and both
// moments once and writes the parameter and the moments once: the step is bound by memory
// bandwidth, so every extra pass (or temporary) would cost as much as the arithmetic. The pass
// is elementwise, so its result does not depend on how parallel_for splits it. The pass itself
// is the SDK's UpdateRule::adamw (training_kernels.hpp: torch.optim.AdamW's order of operations),
// which the SDK base runs on the host and a device backend as its optimizer kernel, both compiled
// with -ffp-contract=off, so the roundings are the ones written there.
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

class AdamW final : public loom::ElementwiseOptimizer {
 public:
  AdamW(const loom::Options& options, loom::ExecutionContext& execution)
      : ElementwiseOptimizer("adamw", execution, {"exp_avg", "exp_avg_sq"}),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        epsilon_(options.get<double>("epsilon")),
        weight_decay_(options.get<double>("weight_decay")) {}

 private:
  void begin_step(double lr, std::int64_t step) override {
    // Bias corrections from the trainer's step count, in double as PyTorch computes them; the
    // constants rounded to float once (as PyTorch does with its Python scalars) so that the inner
    // loop is pure float arithmetic.
    const double t = static_cast<double>(step) + 1.0;
    const double bias_correction1 = 1.0 - std::pow(beta1_, t);
    const double bias_correction2 = 1.0 - std::pow(beta2_, t);
    s_.rule = loom::UpdateRule::adamw;
    s_.decay_factor = static_cast<float>(1.0 - lr * weight_decay_);
    s_.beta1 = static_cast<float>(beta1_);
    s_.one_minus_beta1 = static_cast<float>(1.0 - beta1_);
    s_.beta2 = static_cast<float>(beta2_);
    s_.one_minus_beta2 = static_cast<float>(1.0 - beta2_);
    s_.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    s_.epsilon = static_cast<float>(epsilon_);
    s_.step_size = static_cast<float>(lr / bias_correction1);
  }

  std::optional<loom::ElementwiseUpdate> update_rule(bool weight_decay, bool) const override {
    loom::ElementwiseUpdate u = s_;
    u.decay = weight_decay && weight_decay_ != 0.0;
    return u;
  }

  double beta1_, beta2_, epsilon_, weight_decay_;
  loom::ElementwiseUpdate s_{};
};

loom::OptionSchema adamw_options() {
  loom::OptionSchema s;
  s.number("beta1", 0.9, "Decay rate of the first-moment (mean) estimate.").min(0.0).max(1.0, false);
  s.number("beta2", 0.95, "Decay rate of the second-moment (uncentred variance) estimate.").min(0.0).max(1.0, false);
  s.number("epsilon", 1e-8, "Added to the bias-corrected sqrt of the second moment.").min(0.0, false);
  s.number("weight_decay", 0.1,
           "Decoupled weight decay: p -= lr * weight_decay * p each step, on parameters the weight-decay mask "
           "selects.")
      .min(0.0);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "adamw",
       .description = "Adam with decoupled weight decay (torch.optim.AdamW; Levanter AdamConfig defaults)",
       .version = "1.1.0",
       .options = adamw_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<AdamW>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
