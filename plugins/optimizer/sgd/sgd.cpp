// The `sgd` optimizer: stochastic gradient descent with optional momentum (heavy ball or
// Nesterov), dampening and L2 weight decay, with the semantics of torch.optim.SGD.
//
// Weight decay here is the classic L2 penalty added to the gradient (d = g + wd * p), which then
// also feeds the momentum, exactly as torch.optim.SGD does; it is not AdamW's decoupled decay.
// Each parameter is updated in one fused pass over its value, gradient and momentum buffer: the
// SDK's UpdateRule::sgd (training_kernels.hpp), which the SDK base runs on the host and a device
// backend as its optimizer kernel. Each a + alpha * b there is one fused multiply-add, as in
// PyTorch's vectorised add(alpha); both are compiled with -ffp-contract=off, fusing nothing else.
#include <cmath>
#include <cstdint>
#include <loom/elementwise_optimizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class Sgd final : public loom::ElementwiseOptimizer {
 public:
  // Without momentum SGD keeps no state at all. The buffer is lazy, as in PyTorch: a parameter
  // has one ("momentum_buffer/<parameter>") only from its first update, and a checkpoint without
  // one restarts it at the next update.
  Sgd(const loom::Options& options, loom::ExecutionContext& execution)
      : ElementwiseOptimizer("sgd", execution,
                             options.get<double>("momentum") != 0.0 ? std::vector<std::string>{"momentum_buffer"}
                                                                    : std::vector<std::string>{},
                             true),
        momentum_(options.get<double>("momentum")),
        dampening_(options.get<double>("dampening")),
        nesterov_(options.get<bool>("nesterov")),
        weight_decay_(options.get<double>("weight_decay")) {
    if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0)) {
      const std::string at = options.path().empty() ? "" : options.path() + ".";
      throw loom::UserError(at + "nesterov: Nesterov momentum needs momentum > 0 and dampening = 0, but momentum is " +
                            number(momentum_) + " and dampening " + number(dampening_) +
                            " (set momentum, e.g. 0.9, and dampening: 0, or nesterov: false)");
    }
  }

 private:
  void begin_step(double lr, std::int64_t) override { lr_ = static_cast<float>(lr); }

  // d = g (+ wd p); then, with momentum, buf = d on a parameter's first update (PyTorch starts
  // the buffer at the first gradient, undamped) and buf = momentum buf + (1 - dampening) d after
  // it; the step direction is buf, or d + momentum buf for Nesterov. Finally p -= lr * direction.
  std::optional<loom::ElementwiseUpdate> update_rule(bool weight_decay, bool first) const override {
    loom::ElementwiseUpdate u;
    u.rule = loom::UpdateRule::sgd;
    u.decay = weight_decay && weight_decay_ != 0.0;
    u.lr = lr_;
    u.weight_decay = static_cast<float>(u.decay ? weight_decay_ : 0.0);
    u.momentum = momentum_ != 0.0;
    u.first = u.momentum && first;
    u.nesterov = nesterov_;
    u.momentum_factor = static_cast<float>(momentum_);
    u.one_minus_dampening = static_cast<float>(1.0 - dampening_);
    return u;
  }

  std::string unexpected_state_hint(std::string_view name) const override {
    if (momentum_ == 0.0 && name.starts_with("momentum_buffer/"))
      return "a momentum buffer, but this optimizer has momentum 0; resume with the momentum it was saved with";
    return "";
  }

  double momentum_, dampening_;
  bool nesterov_;
  double weight_decay_;
  float lr_ = 0.0f;
};

loom::OptionSchema sgd_options() {
  loom::OptionSchema s;
  s.number("momentum", 0.0, "Momentum factor; 0 disables momentum (and its buffer).").min(0.0).max(1.0, false);
  s.number("dampening", 0.0, "Dampening of the gradient's contribution to the momentum: buf = m buf + (1 - d) g.")
      .range(0.0, 1.0);
  s.boolean("nesterov", false, "Nesterov momentum (needs momentum > 0 and dampening 0).");
  s.number("weight_decay", 0.0,
           "L2 penalty added to the gradient (g + weight_decay * p), on parameters the weight-decay mask selects.")
      .min(0.0);
  s.section_default("learning_rate", 1e-3);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "sgd",
       .description = "SGD with momentum, Nesterov, dampening and L2 weight decay (torch.optim.SGD)",
       .version = "1.1.0",
       .options = sgd_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<Sgd>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
