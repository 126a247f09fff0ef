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
#include <loom/plugin.hpp>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

// Elements per parallel chunk: 4 arrays x 32 Ki floats = 512 KiB touched per chunk, large
// enough that scheduling a chunk costs far less than streaming it.
constexpr std::int64_t kGrain = std::int64_t{1} << 15;

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
        max_grad_norm_(options.get_optional<double>("max_grad_norm").value_or(0.0)) {}

  double learning_rate() const override { return learning_rate_; }
  double max_grad_norm() const override { return max_grad_norm_; }

  void init(const std::vector<loom::OptimizerParameter>& parameters) override {
    if (initialised_) throw loom::InternalError("adamw: init() called twice");
    std::set<std::string> names;
    for (const auto& op : parameters) {
      if (op.parameter == nullptr) throw loom::InternalError("adamw: init() got a null parameter");
      // State is saved by parameter name, so two parameters with one name would share a slot.
      if (!names.insert(op.parameter->name()).second)
        throw loom::InternalError("adamw: two parameters are named '" + op.parameter->name() +
                                  "'; optimizer state is keyed by name");
      const loom::Shape& shape = op.parameter->shape();
      slots_.push_back({op.parameter, op.weight_decay, loom::Tensor::zeros(shape), loom::Tensor::zeros(shape)});
    }
    initialised_ = true;
  }

  void step(double lr, std::int64_t step) override {
    if (!initialised_) throw loom::InternalError("adamw: step() before init()");
    if (!(lr >= 0.0) || step < 0)
      throw loom::InternalError("adamw: step(lr = " + std::to_string(lr) + ", step = " + std::to_string(step) +
                                "): the learning rate must be >= 0 and the step >= 0");
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

    for (Slot& slot : slots_) {
      if (!slot.parameter->has_grad()) continue;
      const loom::Tensor grad = slot.parameter->grad();
      if (!grad.is_contiguous())
        throw loom::InternalError("adamw: the gradient of '" + slot.parameter->name() + "' is not contiguous");
      float* p = slot.parameter->data().data<float>();
      const float* g = grad.data<float>();
      float* m = slot.exp_avg.data<float>();
      float* v = slot.exp_avg_sq.data<float>();
      const bool decay = slot.weight_decay && weight_decay_ != 0.0;
      execution_.parallel_for(grad.numel(), kGrain, [&](std::int64_t begin, std::int64_t end) {
        if (decay)
          adamw_pass<true>(p + begin, g + begin, m + begin, v + begin, end - begin, s);
        else
          adamw_pass<false>(p + begin, g + begin, m + begin, v + begin, end - begin, s);
      });
    }
  }

  // The live moment tensors, not copies: write them out before the next step().
  std::vector<std::pair<std::string, loom::Tensor>> state() const override {
    std::vector<std::pair<std::string, loom::Tensor>> out;
    out.reserve(2 * slots_.size());
    for (const Slot& slot : slots_) {
      out.emplace_back("exp_avg/" + slot.parameter->name(), slot.exp_avg);
      out.emplace_back("exp_avg_sq/" + slot.parameter->name(), slot.exp_avg_sq);
    }
    return out;
  }

  // Checks everything before copying anything, so a bad checkpoint leaves the state untouched.
  void load_state(const std::vector<std::pair<std::string, loom::Tensor>>& state) override {
    if (!initialised_) throw loom::InternalError("adamw: load_state() before init()");
    std::map<std::string, const loom::Tensor*, std::less<>> expected;
    for (const Slot& slot : slots_) {
      expected.emplace("exp_avg/" + slot.parameter->name(), &slot.exp_avg);
      expected.emplace("exp_avg_sq/" + slot.parameter->name(), &slot.exp_avg_sq);
    }
    std::vector<std::pair<const loom::Tensor*, const loom::Tensor*>> copies;  // {destination, source}
    std::set<std::string, std::less<>> seen;
    for (const auto& [name, tensor] : state) {
      const auto it = expected.find(name);
      if (it == expected.end())
        throw loom::UserError("adamw: the saved optimizer state has '" + name +
                              "', which belongs to no parameter of this model (expected 'exp_avg/<parameter>' "
                              "and 'exp_avg_sq/<parameter>'); was the checkpoint written for another model?");
      if (!seen.insert(name).second) throw loom::UserError("adamw: the saved optimizer state has '" + name + "' twice");
      const loom::Tensor& mine = *it->second;
      if (!tensor.defined() || tensor.dtype() != loom::DType::f32 || !(tensor.shape() == mine.shape()))
        throw loom::UserError("adamw: the saved optimizer state '" + name + "' is " + tensor.str() + ", expected " +
                              mine.str());
      copies.emplace_back(&mine, &tensor);
    }
    for (const auto& [name, tensor] : expected)
      if (!seen.contains(name)) throw loom::UserError("adamw: the saved optimizer state lacks '" + name + "'");
    for (const auto& [destination, source] : copies) destination->copy_from(*source);
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
  s.number("max_grad_norm", 1.0, "Global gradient-norm clip applied by the trainer before the update; 0 or null: none.")
      .min(0.0)
      .nullable();
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {"adamw", "Adam with decoupled weight decay (torch.optim.AdamW; Levanter AdamConfig defaults)", "1.0.0",
       adamw_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<AdamW>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
