// optimizer/rmsprop: an out-of-tree optimizer, PyTorch's torch.optim.RMSprop without momentum:
//   g = grad + weight_decay * p            (L2, on parameters the weight-decay mask selects)
//   v = alpha * v + (1 - alpha) * g^2      (state "square_avg", PyTorch's name for it)
//   p = p - lr * g / (sqrt(v) + epsilon)
// `loom conformance libloom-optimizer-rmsprop.so` checks it against the optimizer contract and
// replays ten steps of torch.optim.RMSprop recorded when loom was built.
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

class RmsProp final : public loom::Optimizer {
 public:
  RmsProp(const loom::Options& options, loom::ExecutionContext& execution)
      : execution_(execution),
        learning_rate_(options.get<double>("learning_rate")),
        alpha_(options.get<double>("alpha")),
        epsilon_(options.get<double>("epsilon")),
        weight_decay_(options.get<double>("weight_decay")),
        max_grad_norm_(opt::read_max_grad_norm(options)) {}

  double learning_rate() const override { return learning_rate_; }
  double max_grad_norm() const override { return max_grad_norm_; }

  void init(const std::vector<loom::OptimizerParameter>& parameters) override {
    opt::check_init("rmsprop", initialised_, parameters);
    for (const auto& op : parameters)
      slots_.push_back({op.parameter, op.weight_decay, loom::Tensor::zeros(op.parameter->shape())});
    initialised_ = true;
  }

  void step(double lr, std::int64_t step) override {
    opt::check_step("rmsprop", initialised_, lr, step);
    opt::for_each_gradient("rmsprop", slots_, [&](Slot& slot, const loom::Tensor& grad) {
      const float rate = static_cast<float>(lr), alpha = static_cast<float>(alpha_),
                  keep = static_cast<float>(1.0 - alpha_), eps = static_cast<float>(epsilon_),
                  wd = slot.weight_decay ? static_cast<float>(weight_decay_) : 0.0f;
      float* p = slot.parameter->data().data<float>();
      const float* g = grad.data<float>();
      float* v = slot.square_avg.data<float>();
      opt::parallel_chunks(execution_, grad.numel(), [&](std::int64_t begin, std::int64_t end) {
        for (std::int64_t i = begin; i < end; ++i) {
          const float gi = wd != 0.0f ? g[i] + wd * p[i] : g[i];
          v[i] = alpha * v[i] + keep * gi * gi;
          p[i] = p[i] - rate * gi / (std::sqrt(v[i]) + eps);
        }
      });
    });
  }

  std::vector<std::pair<std::string, loom::Tensor>> state() const override {
    std::vector<std::pair<std::string, loom::Tensor>> out;
    for (const Slot& slot : slots_) out.emplace_back(opt::key("square_avg", *slot.parameter), slot.square_avg);
    return out;
  }

  void load_state(const std::vector<std::pair<std::string, loom::Tensor>>& saved) override {
    opt::StateMap expected;
    for (const Slot& slot : slots_) expected.emplace(opt::key("square_avg", *slot.parameter), &slot.square_avg);
    opt::load_all("rmsprop", initialised_, expected, saved, "'square_avg/<parameter>'");
  }

 private:
  struct Slot {
    loom::Parameter* parameter;
    bool weight_decay;
    loom::Tensor square_avg;
  };

  loom::ExecutionContext& execution_;
  double learning_rate_, alpha_, epsilon_, weight_decay_, max_grad_norm_;
  std::vector<Slot> slots_;
  bool initialised_ = false;
};

// PyTorch's defaults, but for the learning rate: 1e-2 is torch's, 1e-3 suits loom's small GPTs.
loom::OptionSchema options() {
  loom::OptionSchema s;
  s.number("learning_rate", 1e-3, "Peak learning rate; the lr_schedule shapes it.").min(0.0);
  s.number("alpha", 0.99, "Decay of the running average of squared gradients.").min(0.0).max(1.0, false);
  s.number("epsilon", 1e-8, "Added to the root of the average before dividing.").min(0.0, false);
  s.number("weight_decay", 0.0, "L2 penalty added to the gradient, on parameters the weight-decay mask selects.")
      .min(0.0);
  opt::declare_max_grad_norm(s);
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
