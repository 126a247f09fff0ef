// The `soap` optimizer: ShampoO with Adam in the Preconditioner's eigenbasis (Vyas et al., 2024,
// "SOAP: Improving and Stabilizing Shampoo using Adam"), after the authors' soap.py.
//
// For a matrix parameter (flattened to [m, n] = [shape[0], rest]) with Shampoo's statistics
// L = EMA(G G^T) and R = EMA(G^T G) and their eigenbases QL, QR:
//   G' = QL^T G QR                                  (the gradient in the eigenbasis)
//   M <- beta1 M + (1 - beta1) G';  V <- beta2 V + (1 - beta2) G'^2
//   p <- p - lr sqrt(1 - beta2^k) / (1 - beta1^k) QL (M / (sqrt(V) + eps)) QR^T;  p <- p - lr wd p
//   L, R <- lerp(., G G^T / G^T G, 1 - shampoo_beta)
//   every precondition_frequency steps: QL, QR <- one step of power iteration (L QL, sorted by the
//   estimated eigenvalues, V re-ordered to match) and QR decomposition
// A dimension larger than max_precond_dim has no preconditioner (its basis is the identity);
// vectors get Adam. The first gradient of each parameter only sets up the preconditioner
// (eigendecomposition of L and R), as in the authors' code. Eigen (private to this plugin) does
// the eigendecompositions and QR, in double; the projections go through the backend's GEMM.
#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <loom/optimizer_base.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using loom::Transpose;
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// An eigenvector or a QR factor is defined up to its sign; SOAP's update does not depend on it,
// but its state does. Each column is made to have its largest-magnitude entry positive, so that
// the state is reproducible (and comparable with another implementation).
void canonical_signs(MatrixD& q) {
  for (Eigen::Index c = 0; c < q.cols(); ++c) {
    Eigen::Index best = 0;
    for (Eigen::Index r = 1; r < q.rows(); ++r)
      if (std::abs(q(r, c)) > std::abs(q(best, c))) best = r;
    if (q(best, c) < 0) q.col(c) *= -1.0;
  }
}

void store(const MatrixD& q, float* out) {
  for (Eigen::Index i = 0; i < q.size(); ++i) out[i] = static_cast<float>(q.data()[i]);
}

MatrixD load(const float* in, std::int64_t k) {
  MatrixD m(k, k);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = in[i];
  return m;
}

class Soap final : public loom::OptimizerBase {
 public:
  Soap(const loom::Options& options, loom::ExecutionContext& execution)
      : OptimizerBase("soap", execution),
        beta1_(options.get<double>("beta1")),
        beta2_(options.get<double>("beta2")),
        shampoo_beta_(options.get_optional<double>("shampoo_beta").value_or(beta2_)),
        epsilon_(options.get<double>("epsilon")),
        weight_decay_(options.get<double>("weight_decay")),
        frequency_(options.get<std::int64_t>("precondition_frequency")),
        max_dim_(options.get<std::int64_t>("max_precond_dim")),
        correct_bias_(options.get<bool>("correct_bias")) {}

 private:
  struct Layout {
    std::int64_t m = 1, n = 1;
    bool left = false, right = false;  // whether each side has a preconditioner
  };
  Layout layout(const loom::Shape& shape) const {
    Layout l;
    l.m = shape.rank() >= 2 ? shape[0] : 1;
    l.n = shape.numel() / l.m;
    l.left = shape.rank() >= 2 && l.m <= max_dim_;
    l.right = shape.rank() >= 2 && l.n <= max_dim_;
    return l;
  }

  // exp_avg, exp_avg_sq (in the eigenbasis), step, then GG and Q of each preconditioned side.
  std::vector<loom::StateTensorSpec> state_tensors(const loom::OptimizerParameter& p) const override {
    const loom::Shape& shape = p.parameter->shape();
    const Layout l = layout(shape);
    std::vector<loom::StateTensorSpec> out{{"exp_avg", shape}, {"exp_avg_sq", shape}, {"step", loom::Shape{1}}};
    if (l.left) {
      out.push_back({"GG0", loom::Shape{l.m, l.m}});
      out.push_back({"Q0", loom::Shape{l.m, l.m}});
    }
    if (l.right) {
      out.push_back({"GG1", loom::Shape{l.n, l.n}});
      out.push_back({"Q1", loom::Shape{l.n, l.n}});
    }
    return out;
  }

  void begin_step(double lr, std::int64_t) override { lr_ = lr; }

  struct Sides {
    float *gg_left = nullptr, *q_left = nullptr, *gg_right = nullptr, *q_right = nullptr;
  };
  Sides sides(ParameterState& state, const Layout& l) {
    Sides s;
    std::size_t t = 3;
    if (l.left) {
      s.gg_left = state.tensors[t++].data<float>();
      s.q_left = state.tensors[t++].data<float>();
    }
    if (l.right) {
      s.gg_right = state.tensors[t++].data<float>();
      s.q_right = state.tensors[t++].data<float>();
    }
    return s;
  }

  // out = QL^T x QR (back: QL x QR^T), through the backend's GEMM; x and out are m x n.
  void project(const float* x, float* out, const Layout& l, const Sides& s, bool back) {
    const std::size_t n = static_cast<std::size_t>(l.m * l.n);
    tmp_.resize(n);
    const float* cur = x;
    if (s.q_left) {
      backend().gemm(back ? Transpose::no : Transpose::yes, Transpose::no, l.m, l.n, l.m, 1.0f, s.q_left, l.m, cur, l.n,
                     0.0f, tmp_.data(), l.n);
      cur = tmp_.data();
    }
    if (s.q_right) {
      backend().gemm(Transpose::no, back ? Transpose::yes : Transpose::no, l.m, l.n, l.n, 1.0f, cur, l.n, s.q_right,
                     l.n, 0.0f, out, l.n);
    } else {
      std::copy(cur, cur + n, out);
    }
  }

  // GG <- lerp(GG, G G^T (left) or G^T G (right), 1 - shampoo_beta).
  void accumulate_statistics(const float* g, const Layout& l, const Sides& s) {
    const float w = static_cast<float>(1.0 - shampoo_beta_);
    auto lerp_into = [&](float* gg, std::int64_t k) {
      for (std::int64_t i = 0; i < k * k; ++i) gg[i] = gg[i] + w * (outer_[static_cast<std::size_t>(i)] - gg[i]);
    };
    if (s.gg_left) {
      outer_.resize(static_cast<std::size_t>(l.m * l.m));
      backend().gemm(Transpose::no, Transpose::yes, l.m, l.m, l.n, 1.0f, g, l.n, g, l.n, 0.0f, outer_.data(), l.m);
      lerp_into(s.gg_left, l.m);
    }
    if (s.gg_right) {
      outer_.resize(static_cast<std::size_t>(l.n * l.n));
      backend().gemm(Transpose::yes, Transpose::no, l.n, l.n, l.m, 1.0f, g, l.n, g, l.n, 0.0f, outer_.data(), l.n);
      lerp_into(s.gg_right, l.n);
    }
  }

  // The first basis: eigenvectors of GG + 1e-30 I, by decreasing eigenvalue.
  static void eigenbasis(const float* gg, float* q, std::int64_t k) {
    MatrixD m = load(gg, k) + 1e-30 * MatrixD::Identity(k, k);
    Eigen::SelfAdjointEigenSolver<MatrixD> solver(m);
    MatrixD v = solver.eigenvectors().rowwise().reverse();
    canonical_signs(v);
    store(v, q);
  }

  // One power-iteration step and QR (get_orthogonal_matrix_QR): the basis sorted by the estimated
  // eigenvalues diag(Q^T GG Q), decreasing, with exp_avg_sq's rows (dim 0) or columns (dim 1)
  // sorted alike; then Q <- qr(GG Q).Q.
  void refresh_basis(const float* gg, float* q, std::int64_t k, int dim, float* v, const Layout& l) {
    const MatrixD m = load(gg, k), o = load(q, k);
    const Eigen::VectorXd est = (o.transpose() * m * o).diagonal();
    std::vector<Eigen::Index> order(static_cast<std::size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return est(a) > est(b); });
    MatrixD sorted(k, k);
    for (Eigen::Index c = 0; c < k; ++c) sorted.col(c) = o.col(order[static_cast<std::size_t>(c)]);
    sorted_v_.assign(v, v + l.m * l.n);
    for (std::int64_t i = 0; i < l.m; ++i)
      for (std::int64_t j = 0; j < l.n; ++j) {
        const std::int64_t si = dim == 0 ? order[static_cast<std::size_t>(i)] : i;
        const std::int64_t sj = dim == 1 ? order[static_cast<std::size_t>(j)] : j;
        v[i * l.n + j] = sorted_v_[static_cast<std::size_t>(si * l.n + sj)];
      }
    const MatrixD power = m * sorted;
    Eigen::HouseholderQR<MatrixD> qr(power);
    MatrixD next = qr.householderQ();
    canonical_signs(next);
    store(next, q);
  }

  void update(ParameterState& state, const loom::Tensor& grad) override {
    const Layout l = layout(state.parameter->shape());
    const Sides s = sides(state, l);
    const std::int64_t n = grad.numel();
    float* p = state.parameter->data().data<float>();
    const float* g = grad.data<float>();
    float* m = state.tensors[0].data<float>();
    float* v = state.tensors[1].data<float>();
    float& step_slot = state.tensors[2].data<float>()[0];  // 0: not set up; else 1 + updates applied

    if (step_slot == 0.0f) {  // the first gradient only sets up the preconditioner
      accumulate_statistics(g, l, s);
      if (s.q_left) eigenbasis(s.gg_left, s.q_left, l.m);
      if (s.q_right) eigenbasis(s.gg_right, s.q_right, l.n);
      step_slot = 1.0f;
      return;
    }
    const double k = static_cast<double>(step_slot);  // the authors' state["step"] after += 1
    step_slot += 1.0f;

    projected_.resize(static_cast<std::size_t>(n));
    project(g, projected_.data(), l, s, false);
    const float b1 = static_cast<float>(beta1_), c1 = static_cast<float>(1.0 - beta1_);
    const float b2 = static_cast<float>(beta2_), c2 = static_cast<float>(1.0 - beta2_);
    const float eps = static_cast<float>(epsilon_);
    direction_.resize(static_cast<std::size_t>(n));
    float* gp = projected_.data();
    float* d = direction_.data();
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        m[i] = m[i] * b1 + c1 * gp[i];
        v[i] = v[i] * b2 + c2 * (gp[i] * gp[i]);
        d[i] = m[i] / (std::sqrt(v[i]) + eps);
      }
    });
    double step_size = lr_;
    if (correct_bias_) step_size = step_size * std::sqrt(1.0 - std::pow(beta2_, k)) / (1.0 - std::pow(beta1_, k));
    project(d, gp, l, s, true);
    const float neg_step = static_cast<float>(-step_size);
    const bool decay = state.weight_decay && weight_decay_ != 0.0;
    const float neg_decay = static_cast<float>(-lr_ * weight_decay_);
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        float pi = std::fma(gp[i], neg_step, p[i]);
        if (decay) pi = std::fma(pi, neg_decay, pi);
        p[i] = pi;
      }
    });

    if (!s.q_left && !s.q_right) return;  // nothing to precondition: Adam
    // update_preconditioner: the first moment back to the original basis, the statistics, every
    // precondition_frequency updates a new basis, and the first moment into it.
    project(m, gp, l, s, true);
    accumulate_statistics(g, l, s);
    if (static_cast<std::int64_t>(k) % frequency_ == 0) {
      if (s.q_left) refresh_basis(s.gg_left, s.q_left, l.m, 0, v, l);
      if (s.q_right) refresh_basis(s.gg_right, s.q_right, l.n, 1, v, l);
    }
    project(gp, m, l, s, false);
  }

  double beta1_, beta2_, shampoo_beta_, epsilon_, weight_decay_;
  std::int64_t frequency_, max_dim_;
  bool correct_bias_;
  double lr_ = 0;
  std::vector<float> tmp_, outer_, projected_, direction_, sorted_v_;
};

loom::OptionSchema soap_options() {
  loom::OptionSchema s;
  s.number("beta1", 0.95, "Decay of the first moment (in the eigenbasis).").min(0.0).max(1.0, false);
  s.number("beta2", 0.95, "Decay of the second moment (in the eigenbasis).").min(0.0).max(1.0, false);
  const std::string doc = "Decay of Shampoo's statistics G G^T and G^T G; null: beta2.";
  loom::OptionSpec& shampoo = s.number("shampoo_beta", 0.0, doc);
  shampoo = loom::OptionSpec("shampoo_beta", loom::OptionType::number, loom::Value(), doc);
  shampoo.min(0.0).max(1.0, false).nullable();
  s.number("epsilon", 1e-8, "Added to the sqrt of the second moment.").min(0.0, false);
  s.number("weight_decay", 0.01, "Decoupled weight decay, p -= lr * weight_decay * p, where the mask selects.")
      .min(0.0);
  s.integer("precondition_frequency", 10, "Updates between two refreshes of the eigenbases (power iteration + QR).")
      .min(1);
  s.integer("max_precond_dim", 10000,
            "A dimension larger than this gets no preconditioner (its basis stays the identity).")
      .min(1);
  s.boolean("correct_bias", true, "Adam's bias corrections on the step size.");
  s.section_default("learning_rate", 3e-3);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Optimizer>(
      {.name = "soap",
       .description = "SOAP: Adam in the eigenbasis of Shampoo's preconditioner (Vyas et al. 2024)",
       .version = "1.0.0",
       .options = soap_options()},
      [](const loom::Options& options, const loom::CreateContext& context) {
        return std::make_unique<Soap>(options, context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
