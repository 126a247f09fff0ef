// The `sgd` optimizer: stochastic gradient descent with optional momentum (heavy ball or
// Nesterov), dampening and L2 weight decay, with the semantics of torch.optim.SGD.
//
// Weight decay here is the classic L2 penalty added to the gradient (d = g + wd * p), which then
// also feeds the momentum, exactly as torch.optim.SGD does; it is not AdamW's decoupled decay.
// Each parameter is updated in one fused pass over its value, gradient and momentum buffer.
#include <cmath>
#include <cstdint>
#include <loom/elementwise_optimizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace {

struct SgdStep {
  float lr;
  float weight_decay;  // 0 for parameters the mask leaves undecayed
  float momentum;
  float one_minus_dampening;
};

// d = g (+ wd p); then, with momentum, buf = d on a parameter's first update (PyTorch starts the
// buffer at the first gradient, undamped) and buf = momentum buf + (1 - dampening) d after it;
// the step direction is buf, or d + momentum buf for Nesterov. Finally p -= lr * direction.
// Each a + alpha * b is one fused multiply-add, as in PyTorch's vectorised add(alpha); the
// plugin is compiled with -ffp-contract=off so that the compiler fuses nothing else.
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_pass(float* __restrict p, const float* __restrict g, float* __restrict buf, std::int64_t n, const SgdStep& s) {
  const float neg_lr = -s.lr, wd = s.weight_decay, mu = s.momentum, damp = s.one_minus_dampening;
  for (std::int64_t i = 0; i < n; ++i) {
    const float pi = p[i];
    float d = g[i];
    if constexpr (kDecay) d = std::fma(pi, wd, d);
    if constexpr (kMomentum) {
      float b;
      if constexpr (kFirst)
        b = d;
      else
        b = std::fma(d, damp, buf[i] * mu);
      buf[i] = b;
      if constexpr (kNesterov)
        d = std::fma(b, mu, d);
      else
        d = b;
    }
    p[i] = std::fma(d, neg_lr, pi);
  }
}

using SgdPass = void (*)(float*, const float*, float*, std::int64_t, const SgdStep&);

template <bool kDecay>
SgdPass choose_pass(bool momentum, bool first, bool nesterov) {
  if (!momentum) return &sgd_pass<kDecay, false, false, false>;
  if (first) return nesterov ? &sgd_pass<kDecay, true, true, true> : &sgd_pass<kDecay, true, true, false>;
  return nesterov ? &sgd_pass<kDecay, true, false, true> : &sgd_pass<kDecay, true, false, false>;
}

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

  void update_chunk(const Chunk& c) const override {
    const bool momentum = momentum_ != 0.0;
    const bool decay = c.weight_decay && weight_decay_ != 0.0;
    const SgdStep s{lr_, static_cast<float>(decay ? weight_decay_ : 0.0), static_cast<float>(momentum_),
                    static_cast<float>(1.0 - dampening_)};
    const bool first = momentum && c.first;
    const SgdPass pass =
        decay ? choose_pass<true>(momentum, first, nesterov_) : choose_pass<false>(momentum, first, nesterov_);
    pass(c.parameter, c.grad, c.slots[0], c.size, s);
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
