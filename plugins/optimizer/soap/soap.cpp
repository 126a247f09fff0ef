// The `soap` optimizer: ShampoO with Adam in the Preconditioner's eigenbasis (Vyas et al., 2024,
// "SOAP: Improving and Stabilizing Shampoo using Adam"), after the authors' soap.py, with
// Levanter's blocks.
//
// For a matrix parameter with Shampoo's statistics L = EMA(G G^T) and R = EMA(G^T G) and their
// eigenbases QL, QR:
//   G' = QL^T G QR                                  (the gradient in the eigenbasis)
//   M <- beta1 M + (1 - beta1) G';  V <- beta2 V + (1 - beta2) G'^2
//   p <- p - lr sqrt(1 - beta2^k) / (1 - beta1^k) QL (M / (sqrt(V) + eps)) QR^T;  p <- p - lr wd p
//   L, R <- lerp(., G G^T / G^T G, 1 - shampoo_beta)
//   every precondition_frequency steps: QL, QR <- one step of power iteration (L QL, sorted by the
//   estimated eigenvalues, V re-ordered to match) and QR decomposition
// A tensor of higher rank has one preconditioner per dimension, as in the authors' code
// (merge_dims first merges small dimensions). A dimension larger than max_precond_dim has none
// (its basis is the identity); vectors get Adam unless precondition_1d. With block_size, each
// block of a large dimension is preconditioned on its own (Plan below). The first gradient of each
// parameter only sets up the preconditioners (eigendecompositions), as in the authors' code. Eigen
// (private to this plugin) does the eigendecompositions and QR, in double; the projections and
// statistics go through the backend's GEMM.
#include <Eigen/Eigenvalues>
#include <Eigen/QR>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <loom/error.hpp>
#include <loom/optimizer_base.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <unordered_map>
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

// How a parameter is preconditioned. Its gradient is viewed in a working shape: the parameter's
// own, or with merge_dims its consecutive dimensions merged while their product stays within
// max_precond_dim (the authors' merge_dims). Each dimension of at most max_precond_dim elements
// has a preconditioner (a vector only with precondition_1d). With block_size, a preconditioned
// dimension longer than it is cut into blocks of block_size (the last one shorter, Levanter's
// BlockPartitioner without its padding); every block is then preconditioned on its own, with its
// own statistics and bases: one SOAP per block.
struct Plan {
  std::vector<std::int64_t> dims;    // the working shape
  std::vector<bool> preconditioned;  // per dimension
  std::vector<std::int64_t> side;    // per dimension: a block's longest extent (its stored matrices' side)
  struct Block {
    std::vector<std::int64_t> offset, extent;  // per dimension
    std::int64_t numel = 1;
  };
  std::vector<Block> blocks;  // in row-major order of their offsets
  bool any_preconditioned() const {
    return std::find(preconditioned.begin(), preconditioned.end(), true) != preconditioned.end();
  }
};

// Elements of dims [begin, end).
std::int64_t product(const std::vector<std::int64_t>& v, std::size_t begin, std::size_t end) {
  std::int64_t p = 1;
  for (std::size_t i = begin; i < end; ++i) p *= v[i];
  return p;
}

// Calls copy(full_offset, block_offset, length) for each innermost run of `block` inside a tensor
// of working shape `dims`, both row-major.
template <typename F>
void for_each_run(const std::vector<std::int64_t>& dims, const Plan::Block& block, F&& copy) {
  const std::size_t k = dims.size();
  std::vector<std::int64_t> index(k, 0);  // within the block, all but the last dimension
  const std::int64_t run = block.extent[k - 1];
  for (std::int64_t b = 0; b < block.numel; b += run) {
    std::int64_t full = 0;
    for (std::size_t d = 0; d < k; ++d) full = full * dims[d] + block.offset[d] + (d + 1 < k ? index[d] : 0);
    copy(full, b, run);
    for (std::size_t d = k - 1; d-- > 0;) {  // next index, last dimension excluded
      if (++index[d] < block.extent[d]) break;
      index[d] = 0;
    }
  }
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
        block_size_(options.get_optional<std::int64_t>("block_size").value_or(0)),
        merge_dims_(options.get<bool>("merge_dims")),
        precondition_1d_(options.get<bool>("precondition_1d")),
        correct_bias_(options.get<bool>("correct_bias")) {}

 private:
  Plan plan(const loom::Shape& shape) const {
    Plan p;
    if (shape.rank() <= 1) {
      p.dims = {shape.numel()};
      p.preconditioned = {precondition_1d_ && shape.numel() <= max_dim_};
    } else {
      std::vector<std::int64_t> dims;
      for (int i = 0; i < shape.rank(); ++i) dims.push_back(shape[i]);
      if (merge_dims_) {  // the authors' merge_dims
        std::vector<std::int64_t> merged;
        std::int64_t current = 1;
        for (const std::int64_t d : dims) {
          if (current * d > max_dim_) {
            if (current > 1) {
              merged.push_back(current);
              current = d;
            } else {
              merged.push_back(d);
              current = 1;
            }
          } else {
            current *= d;
          }
        }
        if (current > 1 || merged.empty()) merged.push_back(current);
        dims = std::move(merged);
      }
      p.dims = dims;
      if (dims.size() == 1) {
        // merge_dims made the whole tensor one dimension: a vector, which gets a preconditioner only
        // under precondition_1d. (The authors' code gives it an n x n one regardless: for a
        // [256, 32] matrix with max_precond_dim 10000, an 8192 x 8192 eigendecomposition of a
        // rank-one statistic at set-up, minutes of double-precision work on a CPU.)
        p.preconditioned = {precondition_1d_ && dims[0] <= max_dim_};
      } else {
        for (const std::int64_t d : dims) p.preconditioned.push_back(d <= max_dim_);
      }
    }
    // Blocks: the cartesian product of each dimension's cuts.
    std::vector<std::vector<std::pair<std::int64_t, std::int64_t>>> cuts;  // per dimension: (offset, extent)
    for (std::size_t d = 0; d < p.dims.size(); ++d) {
      const bool cut = block_size_ > 0 && p.preconditioned[d] && p.dims[d] > block_size_;
      const std::int64_t step = std::max<std::int64_t>(1, cut ? block_size_ : p.dims[d]);
      p.side.push_back(step);
      cuts.emplace_back();
      for (std::int64_t o = 0; o < p.dims[d]; o += step) cuts.back().emplace_back(o, std::min(step, p.dims[d] - o));
    }
    for (const auto& c : cuts)
      if (c.empty()) return p;  // an empty tensor: no blocks
    std::vector<std::size_t> index(p.dims.size(), 0);
    while (true) {
      Plan::Block b;
      for (std::size_t d = 0; d < p.dims.size(); ++d) {
        b.offset.push_back(cuts[d][index[d]].first);
        b.extent.push_back(cuts[d][index[d]].second);
        b.numel *= b.extent.back();
      }
      p.blocks.push_back(std::move(b));
      std::size_t d = p.dims.size();
      while (d > 0 && ++index[d - 1] == cuts[d - 1].size()) index[--d] = 0;
      if (d == 0) break;
    }
    return p;
  }

  // exp_avg, exp_avg_sq (in the eigenbasis), step, then GG<d> and Q<d> of each preconditioned
  // dimension d of the working shape: [side, side], or [blocks, side, side] when cut into blocks
  // (a shorter last block uses the top-left corner).
  std::vector<loom::StateTensorSpec> state_tensors(const loom::OptimizerParameter& param) const override {
    const loom::Shape& shape = param.parameter->shape();
    const Plan p = plan(shape);
    std::vector<loom::StateTensorSpec> out{{"exp_avg", shape}, {"exp_avg_sq", shape}, {"step", loom::Shape{1}}};
    for (std::size_t d = 0; d < p.dims.size(); ++d) {
      if (!p.preconditioned[d]) continue;
      const std::int64_t s = p.side[d];
      const loom::Shape matrix =
          p.blocks.size() == 1 ? loom::Shape{s, s} : loom::Shape{static_cast<std::int64_t>(p.blocks.size()), s, s};
      out.push_back({"GG" + std::to_string(d), matrix});
      out.push_back({"Q" + std::to_string(d), matrix});
    }
    return out;
  }

  std::string unexpected_state_hint(std::string_view) const override {
    return "soap's state depends on max_precond_dim, block_size, merge_dims and precondition_1d: a state saved "
           "with other values of them does not fit";
  }

  void begin_step(double lr, std::int64_t) override { lr_ = lr; }

  // One block of one parameter, contiguous (row-major over its extents), with its preconditioners.
  struct BlockView {
    std::vector<std::int64_t> extent;
    std::int64_t numel = 0;
    std::vector<float*> gg, q;  // per dimension; null where not preconditioned
    std::int64_t ld(std::size_t d, const Plan& p) const { return p.side[d]; }
  };

  BlockView view(ParameterState& state, const Plan& p, std::size_t block) {
    BlockView v;
    v.extent = p.blocks[block].extent;
    v.numel = p.blocks[block].numel;
    std::size_t t = 3;
    for (std::size_t d = 0; d < p.dims.size(); ++d) {
      if (!p.preconditioned[d]) {
        v.gg.push_back(nullptr);
        v.q.push_back(nullptr);
        continue;
      }
      const std::int64_t stride = p.side[d] * p.side[d] * static_cast<std::int64_t>(block);
      v.gg.push_back(state.tensors[t++].data<float>() + stride);
      v.q.push_back(state.tensors[t++].data<float>() + stride);
    }
    return v;
  }

  // out = x projected into the eigenbases (back: out of them), dimension by dimension: along
  // dimension d, x viewed as [A, D, B] becomes Q^T x_a (back: Q x_a) for each a. x and out hold
  // the block's numel elements and may be the same buffer.
  void project(const float* x, float* out, const BlockView& b, const Plan& p, bool back) {
    const std::size_t n = static_cast<std::size_t>(b.numel);
    ping_.resize(n);
    pong_.resize(n);
    const float* cur = x;
    for (std::size_t d = 0; d < b.extent.size(); ++d) {
      if (!b.q[d]) continue;
      float* dst = cur == ping_.data() ? pong_.data() : ping_.data();
      const std::int64_t A = product(b.extent, 0, d), D = b.extent[d], B = product(b.extent, d + 1, b.extent.size());
      const std::int64_t ldq = p.side[d];
      if (B == 1) {  // [A, D] x Q (back: Q^T)
        backend().gemm(Transpose::no, back ? Transpose::yes : Transpose::no, A, D, D, 1.0f, cur, D, b.q[d], ldq, 0.0f,
                       dst, D);
      } else {
        for (std::int64_t a = 0; a < A; ++a)
          backend().gemm(back ? Transpose::no : Transpose::yes, Transpose::no, D, B, D, 1.0f, b.q[d], ldq,
                         cur + a * D * B, B, 0.0f, dst + a * D * B, B);
      }
      cur = dst;
    }
    if (cur != out) std::copy(cur, cur + n, out);
  }

  // GG_d <- lerp(GG_d, sum_a g_a g_a^T, 1 - shampoo_beta) for each preconditioned dimension d.
  void accumulate_statistics(const float* g, const BlockView& b, const Plan& p) {
    const float w = static_cast<float>(1.0 - shampoo_beta_);
    for (std::size_t d = 0; d < b.extent.size(); ++d) {
      if (!b.gg[d]) continue;
      const std::int64_t A = product(b.extent, 0, d), D = b.extent[d], B = product(b.extent, d + 1, b.extent.size());
      outer_.resize(static_cast<std::size_t>(D * D));
      if (B == 1) {
        backend().gemm(Transpose::yes, Transpose::no, D, D, A, 1.0f, g, D, g, D, 0.0f, outer_.data(), D);
      } else {
        for (std::int64_t a = 0; a < A; ++a)
          backend().gemm(Transpose::no, Transpose::yes, D, D, B, 1.0f, g + a * D * B, B, g + a * D * B, B,
                         a == 0 ? 0.0f : 1.0f, outer_.data(), D);
      }
      const std::int64_t ld = p.side[d];
      for (std::int64_t i = 0; i < D; ++i)
        for (std::int64_t j = 0; j < D; ++j) {
          float& s = b.gg[d][i * ld + j];
          s = s + w * (outer_[static_cast<std::size_t>(i * D + j)] - s);
        }
    }
  }

  static MatrixD load(const float* in, std::int64_t k, std::int64_t ld) {
    MatrixD m(k, k);
    for (std::int64_t i = 0; i < k; ++i)
      for (std::int64_t j = 0; j < k; ++j) m(i, j) = in[i * ld + j];
    return m;
  }
  static void store(const MatrixD& m, float* out, std::int64_t ld) {
    for (Eigen::Index i = 0; i < m.rows(); ++i)
      for (Eigen::Index j = 0; j < m.cols(); ++j) out[i * ld + j] = static_cast<float>(m(i, j));
  }

  // Statistics that are not finite (gradients that overflowed in G G^T: a diverged run) have no
  // eigenbasis, and Eigen's tridiagonal QR would spend its whole iteration budget (30 k sweeps of
  // O(k^2)) finding that out: refused before any solver runs.
  static void check_finite(const MatrixD& m, const loom::Parameter& parameter, std::size_t d) {
    if (m.allFinite()) return;
    throw loom::UserError("soap: the preconditioner statistics of '" + parameter.name() + "' (dimension " +
                          std::to_string(d) +
                          " of its working shape) are not finite: its gradients overflowed, so the run diverged. "
                          "Lower optimizer.learning_rate, set optimizer.max_grad_norm, or raise the warmup");
  }

  // The first basis: eigenvectors of GG + 1e-30 I, by decreasing eigenvalue. Eigen's solver is
  // iterative but bounded (at most 30 k QR sweeps); should it not converge, the basis stays the
  // identity (Adam along this dimension until the first refresh), as documented in the README.
  static void eigenbasis(const float* gg, float* q, std::int64_t k, std::int64_t ld, const loom::Parameter& parameter,
                         std::size_t d) {
    MatrixD m = load(gg, k, ld);
    check_finite(m, parameter, d);
    m += 1e-30 * MatrixD::Identity(k, k);
    Eigen::SelfAdjointEigenSolver<MatrixD> solver(m);
    MatrixD v = solver.info() == Eigen::Success ? MatrixD(solver.eigenvectors().rowwise().reverse())
                                                : MatrixD(MatrixD::Identity(k, k));
    canonical_signs(v);
    store(v, q, ld);
  }

  // One power-iteration step and QR (get_orthogonal_matrix_QR): the basis sorted by the estimated
  // eigenvalues diag(Q^T GG Q), decreasing, with exp_avg_sq sorted alike along dimension d; then
  // Q <- qr(GG Q).Q.
  // Not iterative: one product and a Householder QR (a fixed number of reflections).
  void refresh_basis(const BlockView& b, std::size_t d, float* v, const Plan& p, const loom::Parameter& parameter) {
    const std::int64_t k = b.extent[d], ld = p.side[d];
    const MatrixD m = load(b.gg[d], k, ld), o = load(b.q[d], k, ld);
    check_finite(m, parameter, d);
    const Eigen::VectorXd est = (o.transpose() * m * o).diagonal();
    std::vector<Eigen::Index> order(static_cast<std::size_t>(k));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](Eigen::Index x, Eigen::Index y) { return est(x) > est(y); });
    MatrixD sorted(k, k);
    for (Eigen::Index c = 0; c < k; ++c) sorted.col(c) = o.col(order[static_cast<std::size_t>(c)]);
    const std::int64_t A = product(b.extent, 0, d), B = product(b.extent, d + 1, b.extent.size());
    sorted_v_.assign(v, v + b.numel);
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t j = 0; j < k; ++j) {
        const float* from = sorted_v_.data() + (a * k + order[static_cast<std::size_t>(j)]) * B;
        std::copy(from, from + B, v + (a * k + j) * B);
      }
    const MatrixD power = m * sorted;
    Eigen::HouseholderQR<MatrixD> qr(power);
    MatrixD next = qr.householderQ();
    canonical_signs(next);
    store(next, b.q[d], ld);
  }

  // The block's elements of `full` into `out` (contiguous), or back.
  static void gather(const float* full, float* out, const Plan& p, std::size_t block) {
    for_each_run(p.dims, p.blocks[block],
                 [&](std::int64_t f, std::int64_t b, std::int64_t n) { std::copy(full + f, full + f + n, out + b); });
  }
  static void scatter(const float* in, float* full, const Plan& p, std::size_t block) {
    for_each_run(p.dims, p.blocks[block],
                 [&](std::int64_t f, std::int64_t b, std::int64_t n) { std::copy(in + b, in + b + n, full + f); });
  }

  void update(ParameterState& state, const loom::Tensor& grad) override {
    // The plan depends on the shape and the options only: made on the first update, then kept.
    auto cached = plans_.find(state.parameter);
    if (cached == plans_.end()) cached = plans_.emplace(state.parameter, plan(state.parameter->shape())).first;
    const Plan& p = cached->second;
    const std::int64_t n = grad.numel();
    float* param = state.parameter->data().data<float>();
    const float* g_full = grad.data<float>();
    float* m_full = state.tensors[0].data<float>();
    float* v_full = state.tensors[1].data<float>();
    float& step_slot = state.tensors[2].data<float>()[0];  // 0: not set up; else 1 + updates applied
    const bool single = p.blocks.size() == 1;

    if (step_slot == 0.0f) {  // the first gradient only sets up the preconditioners
      for (std::size_t i = 0; i < p.blocks.size(); ++i) {
        const BlockView b = view(state, p, i);
        const float* g = g_full;
        if (!single) {
          block_g_.resize(static_cast<std::size_t>(b.numel));
          gather(g_full, block_g_.data(), p, i);
          g = block_g_.data();
        }
        accumulate_statistics(g, b, p);
        for (std::size_t d = 0; d < p.dims.size(); ++d)
          if (b.q[d]) eigenbasis(b.gg[d], b.q[d], b.extent[d], p.side[d], *state.parameter, d);
      }
      step_slot = 1.0f;
      return;
    }
    const double k = static_cast<double>(step_slot);  // the authors' state["step"] after += 1
    step_slot += 1.0f;
    double step_size = lr_;
    if (correct_bias_) step_size = step_size * std::sqrt(1.0 - std::pow(beta2_, k)) / (1.0 - std::pow(beta1_, k));
    const bool refresh = static_cast<std::int64_t>(k) % frequency_ == 0;

    direction_.resize(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < p.blocks.size(); ++i) {
      const BlockView b = view(state, p, i);
      const std::size_t bn = static_cast<std::size_t>(b.numel);
      const float* g = g_full;
      float *m = m_full, *v = v_full, *dir = direction_.data();
      if (!single) {
        block_g_.resize(bn);
        block_m_.resize(bn);
        block_v_.resize(bn);
        block_dir_.resize(bn);
        gather(g_full, block_g_.data(), p, i);
        gather(m_full, block_m_.data(), p, i);
        gather(v_full, block_v_.data(), p, i);
        g = block_g_.data();
        m = block_m_.data();
        v = block_v_.data();
        dir = block_dir_.data();
      }
      update_block(g, m, v, dir, b, p, refresh, *state.parameter);
      if (!single) {
        scatter(m, m_full, p, i);
        scatter(v, v_full, p, i);
        scatter(dir, direction_.data(), p, i);
      }
    }

    const float neg_step = static_cast<float>(-step_size);
    const bool decay = state.weight_decay && weight_decay_ != 0.0;
    const float neg_decay = static_cast<float>(-lr_ * weight_decay_);
    const float* d = direction_.data();
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        float pi = std::fma(d[i], neg_step, param[i]);
        if (decay) pi = std::fma(pi, neg_decay, pi);
        param[i] = pi;
      }
    });
  }

  // Adam in the block's eigenbasis: the moments (m, v, in the basis) and the direction (out of
  // it, before the step size) in `dir`; then the preconditioner's update (update_preconditioner):
  // the first moment back to the original basis, the statistics, every precondition_frequency
  // updates new bases, and the first moment into them.
  void update_block(const float* g, float* m, float* v, float* dir, const BlockView& b, const Plan& p, bool refresh,
                    const loom::Parameter& parameter) {
    const std::int64_t n = b.numel;
    projected_.resize(static_cast<std::size_t>(n));
    project(g, projected_.data(), b, p, false);
    const float b1 = static_cast<float>(beta1_), c1 = static_cast<float>(1.0 - beta1_);
    const float b2 = static_cast<float>(beta2_), c2 = static_cast<float>(1.0 - beta2_);
    const float eps = static_cast<float>(epsilon_);
    float* gp = projected_.data();
    parallel_chunks(n, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t i = begin; i < end; ++i) {
        m[i] = m[i] * b1 + c1 * gp[i];
        v[i] = v[i] * b2 + c2 * (gp[i] * gp[i]);
        gp[i] = m[i] / (std::sqrt(v[i]) + eps);
      }
    });
    project(gp, dir, b, p, true);

    const bool preconditioned =
        std::find_if(b.q.begin(), b.q.end(), [](float* q) { return q != nullptr; }) != b.q.end();
    if (!preconditioned) return;  // nothing to precondition: Adam
    project(m, gp, b, p, true);
    accumulate_statistics(g, b, p);
    if (refresh)
      for (std::size_t d = 0; d < p.dims.size(); ++d)
        if (b.q[d]) refresh_basis(b, d, v, p, parameter);
    project(gp, m, b, p, false);
  }

  double beta1_, beta2_, shampoo_beta_, epsilon_, weight_decay_;
  std::int64_t frequency_, max_dim_, block_size_;
  bool merge_dims_, precondition_1d_, correct_bias_;
  double lr_ = 0;
  std::vector<float> ping_, pong_, outer_, projected_, direction_, sorted_v_;
  std::vector<float> block_g_, block_m_, block_v_, block_dir_;
  std::unordered_map<const loom::Parameter*, Plan> plans_;  // per parameter, from its first update
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
  s.integer("block_size", std::nullopt,
            "Preconditioned dimensions longer than this are cut into blocks of this size (the last one shorter), "
            "each block preconditioned on its own (Levanter's block_size with partition_grads_into_blocks; "
            "Levanter uses 256). null: no blocks, the authors' soap.py.")
      .min(1);
  s.boolean("merge_dims", false,
            "Merge a tensor's consecutive dimensions while their product stays within max_precond_dim, before "
            "preconditioning each dimension (the authors' merge_dims). A tensor merged into one dimension is a "
            "vector: preconditioned only under precondition_1d.");
  s.boolean("precondition_1d", false,
            "Precondition vectors of at most max_precond_dim elements too (the authors' precondition_1d); "
            "otherwise they get Adam.");
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
