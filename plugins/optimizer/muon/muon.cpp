// The `muon` optimizer: MomentUm Orthogonalized by Newton-Schulz (Jordan et al., 2024), with the
// AdamW it needs beside it for the parameters it does not handle, in one optimizer entry
// (Levanter's MuonConfig layout).
//
// For each matrix (a weight of two or more dimensions, flattened to [shape[0], rest]):
//   m <- lerp(m, g, 1 - momentum)                        (= momentum m + (1 - momentum) g)
//   u <- lerp(g, m, momentum) with nesterov, else m
//   O <- NewtonSchulz5(u)                                (~ the orthogonal factor U V^T of u)
//   p <- p (1 - lr wd);  p <- p - lr scale O
// scale = sqrt(max(1, rows / cols)) (Jordan), or 0.2 sqrt(max(rows, cols)) with
// moonlight_scaling (Liu et al., 2025: an update RMS like AdamW's, so AdamW's rate carries over).
// Everything else (embeddings, biases, norms, and the weights `adam_for` names) gets the authors'
// auxiliary Adam at lr * adam_lr_scale. The orthogonalisation's products run through the run's
// backend GEMM, so they run at GEMM speed on its threads.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <loom/optimizer_base.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace {

using loom::Transpose;

// torch.lerp's rounding (its vectorised CPU kernel): start + w (end - start) for |w| < 0.5, else
// end + (w - 1) (end - start), each one fused multiply-add.
inline float lerp(float start, float end, float w) {
  const float diff = end - start;
  return std::abs(w) < 0.5f ? std::fma(w, diff, start) : std::fma(w - 1.0f, diff, end);
}

class Muon final : public loom::OptimizerBase {
 public:
  Muon(const loom::Options& options, loom::ExecutionContext& execution)
      : OptimizerBase("muon", execution),
        momentum_(options.get<double>("momentum")),
        nesterov_(options.get<bool>("nesterov")),
        ns_steps_(options.get<std::int64_t>("ns_steps")),
        moonlight_(options.get<bool>("moonlight_scaling")),
        weight_decay_(options.get<double>("weight_decay")),
        adam_lr_scale_(options.get<double>("adam_lr_scale")),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        epsilon_(options.get<double>("epsilon")),
        adam_for_(options.get<std::vector<std::string>>("adam_for")) {}

 private:
  bool orthogonalised(const loom::OptimizerParameter& p) const {
    if (p.role != loom::ParameterRole::weight || p.parameter->shape().rank() < 2) return false;
    for (const auto& part : adam_for_)
      if (p.parameter->name().find(part) != std::string::npos) return false;
    return true;
  }

  // The momentum of the matrices, which hold nearly all the values (the embeddings' and head's
  // AdamW moments, 8 bytes, are the exception).
  double state_bytes_per_parameter() const override { return 4.0; }

  std::vector<loom::StateTensorSpec> state_tensors(const loom::OptimizerParameter& p) const override {
    const loom::Shape& shape = p.parameter->shape();
    if (orthogonalised(p)) return {{"momentum_buffer", shape}};
    return {{"exp_avg", shape}, {"exp_avg_sq", shape}};
  }

  void begin_step(double lr, std::int64_t step) override {
    lr_ = lr;
    step_ = step;
  }

  void update(ParameterState& state, const loom::Tensor& grad) override {
    if (state.tensors.size() == 1)
      update_matrix(state, grad);
    else
      update_adam(state, grad);
  }

  void update_matrix(ParameterState& state, const loom::Tensor& grad) {
    const std::int64_t n = grad.numel();
    const std::int64_t rows = state.parameter->shape()[0], cols = n / rows;
    float* p = state.parameter->data().data<float>();
    const float* g = grad.data<float>();
    float* m = state.tensors[0].data<float>();
    u_.resize(static_cast<std::size_t>(n));
    float* u = u_.data();
    const float w = static_cast<float>(1.0 - momentum_), beta = static_cast<float>(momentum_);
    const bool nesterov = nesterov_;
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        m[i] = lerp(m[i], g[i], w);
        u[i] = nesterov ? lerp(g[i], m[i], beta) : m[i];
      }
    });
    const float* o = newton_schulz(u, rows, cols);
    const double scale = moonlight_ ? 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)))
                                    : std::sqrt(std::max(1.0, static_cast<double>(rows) / static_cast<double>(cols)));
    const float s = static_cast<float>(scale), neg_lr = static_cast<float>(-lr_);
    const bool decay = state.weight_decay && weight_decay_ != 0.0;
    const float keep = static_cast<float>(1.0 - lr_ * weight_decay_);
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        float pi = p[i];
        if (decay) pi *= keep;
        p[i] = std::fma(o[i] * s, neg_lr, pi);
      }
    });
  }

  // The quintic Newton-Schulz iteration of Jordan et al. on x (rows x cols), in float32: on the
  // wide orientation X (r <= c), X /= |X|_F + 1e-7, then ns_steps times A = X X^T,
  // B = b A + c A A, X = a X + B X, with (a, b, c) = (3.4445, -4.7750, 2.0315). Returns the result
  // in the original orientation (in a workspace, valid until the next call).
  const float* newton_schulz(const float* x, std::int64_t rows, std::int64_t cols) {
    const bool tall = rows > cols;
    const std::int64_t r = tall ? cols : rows, c = tall ? rows : cols, n = r * c;
    x_.resize(static_cast<std::size_t>(n));
    next_.resize(static_cast<std::size_t>(n));
    a_.resize(static_cast<std::size_t>(r * r));
    b_.resize(static_cast<std::size_t>(r * r));
    float* X = x_.data();
    if (tall) {
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) X[j * rows + i] = x[i * cols + j];
    } else {
      std::copy(x, x + n, X);
    }
    double sum_squares = 0;
    for (std::int64_t i = 0; i < n; ++i) sum_squares += static_cast<double>(X[i]) * X[i];
    const float norm = static_cast<float>(std::sqrt(sum_squares));
    const float denominator = norm + 1e-7f;
    for (std::int64_t i = 0; i < n; ++i) X[i] = X[i] / denominator;

    constexpr float ka = 3.4445f, kb = -4.7750f, kc = 2.0315f;
    loom::Backend& blas = backend();
    float *A = a_.data(), *B = b_.data(), *next = next_.data();
    for (std::int64_t step = 0; step < ns_steps_; ++step) {
      blas.gemm(Transpose::no, Transpose::yes, r, r, c, 1.0f, X, c, X, c, 0.0f, A, r);
      for (std::int64_t i = 0; i < r * r; ++i) B[i] = kb * A[i];
      blas.gemm(Transpose::no, Transpose::no, r, r, r, kc, A, r, A, r, 1.0f, B, r);
      for (std::int64_t i = 0; i < n; ++i) next[i] = ka * X[i];
      blas.gemm(Transpose::no, Transpose::no, r, c, r, 1.0f, B, r, X, c, 1.0f, next, c);
      std::swap(X, next);
    }
    if (!tall) return X;
    float* out = X == x_.data() ? next_.data() : x_.data();
    for (std::int64_t i = 0; i < rows; ++i)
      for (std::int64_t j = 0; j < cols; ++j) out[i * cols + j] = X[j * rows + i];
    return out;
  }

  // The authors' auxiliary Adam (adam_update in Jordan's muon.py): lerp moments, bias-corrected
  // m / (sqrt(v) + eps), decoupled decay, at lr * adam_lr_scale; the step is the trainer's.
  void update_adam(ParameterState& state, const loom::Tensor& grad) {
    const double lr = lr_ * adam_lr_scale_, t = static_cast<double>(step_) + 1.0;
    const float w1 = static_cast<float>(1.0 - beta1_), w2 = static_cast<float>(1.0 - beta2_);
    const float bc1 = static_cast<float>(1.0 - std::pow(beta1_, t)),
                bc2 = static_cast<float>(1.0 - std::pow(beta2_, t));
    const float eps = static_cast<float>(epsilon_), neg_lr = static_cast<float>(-lr);
    const bool decay = state.weight_decay && weight_decay_ != 0.0;
    const float keep = static_cast<float>(1.0 - lr * weight_decay_);
    float* p = state.parameter->data().data<float>();
    const float* g = grad.data<float>();
    float* m = state.tensors[0].data<float>();
    float* v = state.tensors[1].data<float>();
    parallel_chunks(grad.numel(), [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        const float gi = g[i];
        const float mi = lerp(m[i], gi, w1), vi = lerp(v[i], gi * gi, w2);
        m[i] = mi;
        v[i] = vi;
        const float step = (mi / bc1) / (std::sqrt(vi / bc2) + eps);
        float pi = p[i];
        if (decay) pi *= keep;
        p[i] = std::fma(step, neg_lr, pi);
      }
    });
  }

  double momentum_;
  bool nesterov_;
  std::int64_t ns_steps_;
  bool moonlight_;
  double weight_decay_, adam_lr_scale_, beta1_, beta2_, epsilon_;
  std::vector<std::string> adam_for_;
  double lr_ = 0;
  std::int64_t step_ = 0;
  std::vector<float> u_, x_, next_, a_, b_;  // workspaces, reused from step to step
};

loom::OptionSchema muon_options() {
  loom::OptionSchema s;
  s.number("momentum", 0.95, "Momentum of the matrices' update (Jordan et al.: 0.95).").min(0.0).max(1.0, false);
  s.boolean("nesterov", true, "Orthogonalise the Nesterov look-ahead lerp(g, m, momentum) instead of m.");
  s.integer("ns_steps", 5, "Newton-Schulz iterations of the quintic orthogonalisation.").range(1, 20);
  s.boolean("moonlight_scaling", false,
            "Scale each orthogonalised update by 0.2 sqrt(max(rows, cols)) (Moonlight, Liu et al. 2025) instead of "
            "sqrt(max(1, rows / cols)).");
  s.number("weight_decay", 0.1,
           "Decoupled weight decay, p -= lr * weight_decay * p, on parameters the weight-decay mask selects (the "
           "AdamW ones at their own lr).")
      .min(0.0);
  s.number("adam_lr_scale", 0.03,
           "The AdamW parameters' learning rate as a fraction of Muon's (Levanter: adam_lr 6e-4 / lr 0.02).")
      .min(0.0);
  s.number("beta1", 0.9, "AdamW (non-matrix parameters): decay of the first moment.").min(0.0).max(1.0, false);
  s.number("beta2", 0.95, "AdamW: decay of the second moment.").min(0.0).max(1.0, false);
  s.number("epsilon", 1e-8, "AdamW: added to the bias-corrected sqrt of the second moment.").min(0.0, false);
  s.list("adam_for", loom::OptionType::string, {loom::Value("lm_head")},
         "Weights (by a part of their name) that get AdamW although they are matrices; embeddings, norms and biases "
         "always do.");
  s.section_default("learning_rate", 0.02);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "muon",
       .description =
           "Muon: Newton-Schulz-orthogonalised momentum for matrices, AdamW for the rest (Jordan et al. 2024)",
       .version = "1.0.0",
       .options = muon_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<Muon>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
