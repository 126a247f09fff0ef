// The `sgd` optimizer: stochastic gradient descent with optional momentum (heavy ball or
// Nesterov), dampening and L2 weight decay, with the semantics of torch.optim.SGD.
//
// Weight decay here is the classic L2 penalty added to the gradient (d = g + wd * p), which then
// also feeds the momentum, exactly as torch.optim.SGD does; it is not AdamW's decoupled decay.
// Each parameter is updated in one fused pass over its value, gradient and momentum buffer.
#include <cmath>
#include <cstdint>
#include <loom/kinds/optimizer.hpp>
#include <loom/optimizer_state.hpp>
#include <loom/plugin.hpp>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace {

namespace opt = loom::optimizer_state;

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

class Sgd final : public loom::Optimizer {
 public:
  Sgd(const loom::Options& options, loom::ExecutionContext& execution)
      : execution_(execution),
        learning_rate_(options.get<double>("learning_rate")),
        momentum_(options.get<double>("momentum")),
        dampening_(options.get<double>("dampening")),
        nesterov_(options.get<bool>("nesterov")),
        weight_decay_(options.get<double>("weight_decay")),
        max_grad_norm_(opt::read_max_grad_norm(options)) {
    if (nesterov_ && (momentum_ <= 0.0 || dampening_ != 0.0)) {
      const std::string at = options.path().empty() ? "" : options.path() + ".";
      throw loom::UserError(at + "nesterov: Nesterov momentum needs momentum > 0 and dampening = 0, but momentum is " +
                            number(momentum_) + " and dampening " + number(dampening_) +
                            " (set momentum, e.g. 0.9, and dampening: 0, or nesterov: false)");
    }
  }

  double learning_rate() const override { return learning_rate_; }
  double max_grad_norm() const override { return max_grad_norm_; }

  void init(const std::vector<loom::OptimizerParameter>& parameters) override {
    opt::check_init("sgd", initialised_, parameters);
    for (const auto& op : parameters) {
      Slot slot{op.parameter, op.weight_decay, {}, false};
      // Without momentum SGD keeps no state at all.
      if (momentum_ != 0.0) slot.momentum_buffer = loom::Tensor::zeros(op.parameter->shape());
      slots_.push_back(std::move(slot));
    }
    initialised_ = true;
  }

  void step(double lr, std::int64_t step) override {
    opt::check_step("sgd", initialised_, lr, step);
    const bool momentum = momentum_ != 0.0;
    opt::for_each_gradient("sgd", slots_, [&](Slot& slot, const loom::Tensor& grad) {
      const bool decay = slot.weight_decay && weight_decay_ != 0.0;
      const SgdStep s{static_cast<float>(lr), static_cast<float>(decay ? weight_decay_ : 0.0),
                      static_cast<float>(momentum_), static_cast<float>(1.0 - dampening_)};
      const bool first = momentum && !slot.buffer_started;
      const SgdPass pass =
          decay ? choose_pass<true>(momentum, first, nesterov_) : choose_pass<false>(momentum, first, nesterov_);
      float* p = slot.parameter->data().data<float>();
      const float* g = grad.data<float>();
      float* buf = momentum ? slot.momentum_buffer.data<float>() : nullptr;
      opt::parallel_chunks(execution_, grad.numel(), [&](std::int64_t begin, std::int64_t end) {
        pass(p + begin, g + begin, buf ? buf + begin : nullptr, end - begin, s);
      });
      slot.buffer_started = momentum;
    });
  }

  // One "momentum_buffer/<parameter>" per parameter whose buffer has started (PyTorch's
  // state_dict likewise has no buffer before a parameter's first update). The live tensors, not
  // copies: write them out before the next step().
  std::vector<std::pair<std::string, loom::Tensor>> state() const override {
    std::vector<std::pair<std::string, loom::Tensor>> out;
    for (const Slot& slot : slots_)
      if (slot.buffer_started) out.emplace_back(opt::key("momentum_buffer", *slot.parameter), slot.momentum_buffer);
    return out;
  }

  // A parameter absent from `state` gets a fresh buffer, started by its next update.
  void load_state(const std::vector<std::pair<std::string, loom::Tensor>>& saved) override {
    if (!initialised_) throw loom::InternalError("sgd: load_state() before init()");
    opt::StateMap expected;
    for (const Slot& slot : slots_)
      expected.emplace(opt::key("momentum_buffer", *slot.parameter), &slot.momentum_buffer);
    const auto matches =
        opt::match_state("sgd", expected, saved, "'momentum_buffer/<parameter>'", false, [&](const std::string& name) {
          if (momentum_ == 0.0)
            throw loom::UserError("sgd: the saved optimizer state has momentum buffers ('" + name +
                                  "') but this optimizer has momentum 0; resume with the momentum it was saved with");
        });
    std::map<const loom::Tensor*, const loom::Tensor*> sources(matches.begin(), matches.end());  // live -> saved
    for (Slot& slot : slots_) {
      const auto it = sources.find(&slot.momentum_buffer);
      slot.buffer_started = it != sources.end();
      if (slot.buffer_started) slot.momentum_buffer.copy_from(*it->second);
    }
  }

 private:
  struct Slot {
    loom::Parameter* parameter;
    bool weight_decay;
    loom::Tensor momentum_buffer;  // undefined when momentum is 0
    bool buffer_started;
  };

  loom::ExecutionContext& execution_;
  double learning_rate_, momentum_, dampening_;
  bool nesterov_;
  double weight_decay_, max_grad_norm_;
  std::vector<Slot> slots_;
  bool initialised_ = false;
};

loom::OptionSchema sgd_options() {
  loom::OptionSchema s;
  s.number("learning_rate", 1e-3, "Peak learning rate; the lr_schedule shapes it.").min(0.0);
  s.number("momentum", 0.0, "Momentum factor; 0 disables momentum (and its buffer).").min(0.0).max(1.0, false);
  s.number("dampening", 0.0, "Dampening of the gradient's contribution to the momentum: buf = m buf + (1 - d) g.")
      .range(0.0, 1.0);
  s.boolean("nesterov", false, "Nesterov momentum (needs momentum > 0 and dampening 0).");
  s.number("weight_decay", 0.0,
           "L2 penalty added to the gradient (g + weight_decay * p), on parameters the weight-decay mask selects.")
      .min(0.0);
  opt::declare_max_grad_norm(s);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "sgd",
       .description = "SGD with momentum, Nesterov, dampening and L2 weight decay (torch.optim.SGD)",
       .version = "1.0.0",
       .options = sgd_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<Sgd>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
