// optimizer/rmsprop: an out-of-tree optimizer, PyTorch's torch.optim.RMSprop without momentum:
//   g = grad + weight_decay * p            (L2, on parameters the weight-decay mask selects)
//   v = alpha * v + (1 - alpha) * g^2      (state "square_avg", PyTorch's name for it)
//   p = p - lr * g / (sqrt(v) + epsilon)
// On the SDK's elementwise base, it writes its options and its per-element update; the base owns
// the state tensors, their checkpoint names, the checks and the parallel chunks.
// `loom conformance libloom-optimizer-rmsprop.so` checks it against the optimizer contract and
// replays ten steps of torch.optim.RMSprop recorded when loom was built.
#include <cmath>
#include <cstdint>
#include <loom/elementwise_optimizer.hpp>
#include <loom/plugin.hpp>
#include <memory>

namespace {

class RmsProp final : public loom::ElementwiseOptimizer {
 public:
  RmsProp(const loom::Options& options, loom::ExecutionContext& execution)
      : ElementwiseOptimizer("rmsprop", execution, {"square_avg"}),
        alpha_(static_cast<float>(options.get<double>("alpha"))),
        keep_(static_cast<float>(1.0 - options.get<double>("alpha"))),
        epsilon_(static_cast<float>(options.get<double>("epsilon"))),
        weight_decay_(static_cast<float>(options.get<double>("weight_decay"))) {}

 private:
  void begin_step(double lr, std::int64_t) override { lr_ = static_cast<float>(lr); }

  void update_chunk(const Chunk& c) const override {
    const float wd = c.weight_decay ? weight_decay_ : 0.0f;
    float* p = c.parameter;
    float* v = c.slots[0];
    for (std::int64_t i = 0; i < c.size; ++i) {
      const float g = wd != 0.0f ? c.grad[i] + wd * p[i] : c.grad[i];
      v[i] = alpha_ * v[i] + keep_ * g * g;
      p[i] = p[i] - lr_ * g / (std::sqrt(v[i]) + epsilon_);
    }
  }

  float alpha_, keep_, epsilon_, weight_decay_;
  float lr_ = 0.0f;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.number("alpha", 0.99, "Decay of the running average of squared gradients.").min(0.0).max(1.0, false);
  s.number("epsilon", 1e-8, "Added to the root of the average before dividing.").min(0.0, false);
  s.number("weight_decay", 0.0, "L2 penalty added to the gradient, on parameters the weight-decay mask selects.")
      .min(0.0);
  // torch's default rate is 1e-2; 1e-3 suits loom's small GPTs.
  s.section_default("learning_rate", 1e-3);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "rmsprop",
       .description = "RMSprop without momentum, as torch.optim.RMSprop (an out-of-tree example)",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext& context) {
        return std::make_unique<RmsProp>(o, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
