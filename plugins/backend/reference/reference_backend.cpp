// backend/reference: every kernel of the backend contract as a plain loop accumulating in
// float64. The oracle of the conformance suite; written to be obviously right, not fast.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <loom/kinds/backend.hpp>
#include <loom/plugin.hpp>
#include <loom/random.hpp>
#include <memory>
#include <utility>
#include <vector>

namespace {

using std::int64_t;

constexpr double sqrt_2_over_pi = 0.7978845608028654;
constexpr double gelu_coeff = 0.044715;

double act_value(loom::Activation act, double x) {
  switch (act) {
    case loom::Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + gelu_coeff * x * x * x)));
    case loom::Activation::silu:
      return x / (1.0 + std::exp(-x));
    case loom::Activation::none:
      break;
  }
  return x;
}

double act_derivative(loom::Activation act, double x) {
  switch (act) {
    case loom::Activation::gelu_tanh: {
      const double t = std::tanh(sqrt_2_over_pi * (x + gelu_coeff * x * x * x));
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * sqrt_2_over_pi * (1.0 + 3.0 * gelu_coeff * x * x);
    }
    case loom::Activation::silu: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 + x * (1.0 - s));
    }
    case loom::Activation::none:
      break;
  }
  return 1.0;
}

void store(float* y, int64_t i, double v, bool accumulate) {
  y[i] = accumulate ? static_cast<float>(static_cast<double>(y[i]) + v) : static_cast<float>(v);
}

class ReferenceBackend final : public loom::Backend {
 public:
  std::string_view name() const override { return "reference"; }

  void gemm(loom::Transpose trans_a, loom::Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override {
    const bool ta = trans_a == loom::Transpose::yes, tb = trans_b == loom::Transpose::yes;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const double av = ta ? a[p * lda + i] : a[i * lda + p];
          const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
          acc += av * bv;
        }
        const double prior = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c[i * ldc + j];
        c[i * ldc + j] = static_cast<float>(static_cast<double>(alpha) * acc + prior);
      }
  }

  void gemm_batched(loom::Transpose trans_a, loom::Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b,
                    float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) override {
    for (int64_t i = 0; i < batch; ++i)
      gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
  }

  void bias_activation_forward(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                               loom::Activation act) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        float& p = pre[r * cols + j];
        if (bias) p = static_cast<float>(static_cast<double>(p) + bias[j]);
        if (act != loom::Activation::none) out[r * cols + j] = static_cast<float>(act_value(act, p));
      }
  }

  void bias_activation_backward(const float* pre, const float* dout, float* dpre, float* dbias, bool accumulate_dbias,
                                int64_t rows, int64_t cols, loom::Activation act) override {
    std::vector<double>& sums = zeroed(sums_, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = r * cols + j;
        const double d = act == loom::Activation::none ? static_cast<double>(dout[i])
                                                       : static_cast<double>(dout[i]) * act_derivative(act, pre[i]);
        if (act != loom::Activation::none || dpre != dout) dpre[i] = static_cast<float>(d);
        sums[static_cast<std::size_t>(j)] += d;
      }
    if (dbias)
      for (int64_t j = 0; j < cols; ++j) store(dbias, j, sums[static_cast<std::size_t>(j)], accumulate_dbias);
  }

  void activation_forward(loom::Activation act, const float* x, float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(act_value(act, x[i]));
  }

  void activation_backward(loom::Activation act, const float* x, const float* dy, float* dx, int64_t n,
                           bool accumulate) override {
    for (int64_t i = 0; i < n; ++i) store(dx, i, static_cast<double>(dy[i]) * act_derivative(act, x[i]), accumulate);
  }

  void swiglu_forward(const float* gate, const float* up, float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      y[i] = static_cast<float>(act_value(loom::Activation::silu, gate[i]) * static_cast<double>(up[i]));
  }

  void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, bool accumulate_dgate,
                       float* dup, bool accumulate_dup, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const double g = gate[i], u = up[i], d = dy[i];
      if (dgate) store(dgate, i, d * u * act_derivative(loom::Activation::silu, g), accumulate_dgate);
      if (dup) store(dup, i, d * act_value(loom::Activation::silu, g), accumulate_dup);
    }
  }

  void add(const float* a, const float* b, float* y, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<double>(a[i]) + b[i]);
  }

  void scale(const float* x, float alpha, float* y, int64_t n, bool accumulate) override {
    for (int64_t i = 0; i < n; ++i) store(y, i, static_cast<double>(alpha) * x[i], accumulate);
  }

  void fill(float* y, float value, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] = value;
  }

  void dropout(const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate) override {
    const std::uint32_t threshold = loom::dropout_threshold(p);
    const float scale = loom::dropout_scale(p);
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = loom::dropout_keep(key, static_cast<std::uint32_t>(i), threshold);
      store(y, i, keep ? static_cast<double>(x[i] * scale) : 0.0, accumulate);
    }
  }

  void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                          int64_t rows, int64_t cols, float eps) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      double mu = 0.0;
      for (int64_t j = 0; j < cols; ++j) mu += xr[j];
      mu /= static_cast<double>(cols);
      double var = 0.0;
      for (int64_t j = 0; j < cols; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      var /= static_cast<double>(cols);
      const double rs = 1.0 / std::sqrt(var + eps);
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(rs);
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = (xr[j] - mu) * rs;
        y[r * cols + j] = static_cast<float>(xhat * (weight ? weight[j] : 1.0) + (bias ? bias[j] : 0.0));
      }
    }
  }

  void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
                           float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight, float* dbias,
                           bool accumulate_dbias, int64_t rows, int64_t cols) override {
    std::vector<double>& dw = zeroed(dw_, cols);
    std::vector<double>& db = zeroed(db_, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* gr = dy + r * cols;
      const double mu = mean[r], rs = rstd[r];
      double sum_g = 0.0, sum_gx = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = (xr[j] - mu) * rs;
        const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
        sum_g += g;
        sum_gx += g * xhat;
        dw[static_cast<std::size_t>(j)] += gr[j] * xhat;
        db[static_cast<std::size_t>(j)] += gr[j];
      }
      sum_g /= static_cast<double>(cols);
      sum_gx /= static_cast<double>(cols);
      if (dx)
        for (int64_t j = 0; j < cols; ++j) {
          const double xhat = (xr[j] - mu) * rs;
          const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
          store(dx, r * cols + j, rs * (g - sum_g - xhat * sum_gx), accumulate_dx);
        }
    }
    for (int64_t j = 0; j < cols; ++j) {
      if (dweight) store(dweight, j, dw[static_cast<std::size_t>(j)], accumulate_dweight);
      if (dbias) store(dbias, j, db[static_cast<std::size_t>(j)], accumulate_dbias);
    }
  }

  void add_layer_norm_forward(const float* a, const float* b, float* sum, const float* weight, const float* bias,
                              float* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) override {
    add(a, b, sum, rows * cols);
    layer_norm_forward(sum, weight, bias, y, mean, rstd, rows, cols, eps);
  }

  void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t cols,
                        float eps) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      double ms = 0.0;
      for (int64_t j = 0; j < cols; ++j) ms += static_cast<double>(xr[j]) * xr[j];
      ms /= static_cast<double>(cols);
      const double rs = 1.0 / std::sqrt(ms + eps);
      rstd[r] = static_cast<float>(rs);
      for (int64_t j = 0; j < cols; ++j) y[r * cols + j] = static_cast<float>(xr[j] * rs * (weight ? weight[j] : 1.0));
    }
  }

  void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                         bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                         int64_t cols) override {
    std::vector<double>& dw = zeroed(dw_, cols);
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const float* gr = dy + r * cols;
      const double rs = rstd[r];
      double sum_gx = 0.0;
      for (int64_t j = 0; j < cols; ++j) {
        const double xhat = xr[j] * rs;
        sum_gx += static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0) * xhat;
        dw[static_cast<std::size_t>(j)] += gr[j] * xhat;
      }
      sum_gx /= static_cast<double>(cols);
      if (dx)
        for (int64_t j = 0; j < cols; ++j) {
          const double xhat = xr[j] * rs;
          const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
          store(dx, r * cols + j, rs * (g - xhat * sum_gx), accumulate_dx);
        }
    }
    if (dweight)
      for (int64_t j = 0; j < cols; ++j) store(dweight, j, dw[static_cast<std::size_t>(j)], accumulate_dweight);
  }

  void add_rms_norm_forward(const float* a, const float* b, float* sum, const float* weight, float* y, float* rstd,
                            int64_t rows, int64_t cols, float eps) override {
    add(a, b, sum, rows * cols);
    rms_norm_forward(sum, weight, y, rstd, rows, cols, eps);
  }

  void embedding_forward(const float* table, const std::int32_t* ids, float* out, int64_t n, int64_t dim,
                         int64_t /*vocab*/) override {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < dim; ++j) out[i * dim + j] = table[static_cast<int64_t>(ids[i]) * dim + j];
  }

  void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                          int64_t vocab) override {
    // Sum every id's rows in float64, then add once.
    std::vector<double>& acc = zeroed(table_, vocab * dim);
    std::vector<double>& seen = zeroed(seen_, vocab);
    for (int64_t i = 0; i < n; ++i) {
      seen[static_cast<std::size_t>(ids[i])] = 1.0;
      for (int64_t j = 0; j < dim; ++j) acc[static_cast<std::size_t>(ids[i] * dim + j)] += dout[i * dim + j];
    }
    for (int64_t v = 0; v < vocab; ++v)
      if (seen[static_cast<std::size_t>(v)] != 0.0)
        for (int64_t j = 0; j < dim; ++j) store(dtable, v * dim + j, acc[static_cast<std::size_t>(v * dim + j)], true);
  }

  void rope(const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y, int64_t y_batch_stride,
            int64_t y_token_stride, const float* cos, const float* sin, const std::int32_t* positions,
            int64_t position_offset, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool interleaved,
            bool inverse, bool accumulate) override {
    const int64_t half = head_dim / 2;
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < seq; ++t) {
        const int64_t pos = positions ? positions[b * seq + t] : position_offset + t;
        const float* xt = x + b * x_batch_stride + t * x_token_stride;
        float* yt = y + b * y_batch_stride + t * y_token_stride;
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const int64_t ia = h * head_dim + (interleaved ? 2 * i : i);
            const int64_t ib = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
            const double c = cos[pos * half + i];
            const double s = inverse ? -static_cast<double>(sin[pos * half + i]) : sin[pos * half + i];
            const double a = xt[ia], bv = xt[ib];
            store(yt, ia, a * c - bv * s, accumulate);
            store(yt, ib, a * s + bv * c, accumulate);
          }
      }
  }

  void cross_entropy_forward(const float* logits, int64_t ld, const std::int32_t* targets, float* losses, float* lse,
                             int64_t rows, int64_t vocab, std::int32_t ignore_index) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* l = logits + r * ld;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < vocab; ++j) mx = std::max(mx, static_cast<double>(l[j]));
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(l[j] - mx);
      const double z = mx + std::log(sum);
      lse[r] = static_cast<float>(z);
      losses[r] = targets[r] == ignore_index ? 0.0f : static_cast<float>(z - l[targets[r]]);
    }
  }

  void cross_entropy_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse,
                              float grad_scale, int64_t rows, int64_t vocab, std::int32_t ignore_index) override {
    for (int64_t r = 0; r < rows; ++r) {
      float* l = logits + r * ld;
      const bool ignored = targets[r] == ignore_index;
      for (int64_t j = 0; j < vocab; ++j) {
        if (ignored) {
          l[j] = 0.0f;
          continue;
        }
        const double p = std::exp(static_cast<double>(l[j]) - lse[r]);
        l[j] = static_cast<float>(grad_scale * (p - (j == targets[r] ? 1.0 : 0.0)));
      }
    }
  }

  // ---- Issue 25, slice 1: the operations the core computed on the host before.

  void mul(const float* a, const float* b, float* y, int64_t n, bool accumulate) override {
    for (int64_t i = 0; i < n; ++i) store(y, i, static_cast<double>(a[i]) * b[i], accumulate);
  }

  void softcap_forward(const float* x, float* y, float* tanh_out, int64_t n, float cap) override {
    for (int64_t i = 0; i < n; ++i) {
      const double h = std::tanh(static_cast<double>(x[i]) / cap);
      y[i] = static_cast<float>(cap * h);
      if (tanh_out) tanh_out[i] = static_cast<float>(h);
    }
  }

  void softcap_backward(const float* h, float h_scale, const float* dy, float* dx, int64_t n,
                        bool accumulate) override {
    for (int64_t i = 0; i < n; ++i) {
      const double t = static_cast<double>(h[i]) * h_scale;
      store(dx, i, static_cast<double>(dy[i]) * (1.0 - t * t), accumulate);
    }
  }

  // A row's maximum and sum of exp(x - max), in double.
  static std::pair<double, double> max_and_exp_sum(const float* xr, int64_t cols) {
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t c = 0; c < cols; ++c) mx = std::max(mx, static_cast<double>(xr[c]));
    double sum = 0.0;
    for (int64_t c = 0; c < cols; ++c) sum += std::exp(xr[c] - mx);
    return {mx, sum};
  }

  void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + r * cols;
      const auto [mx, sum] = max_and_exp_sum(xr, cols);
      for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = static_cast<float>(std::exp(xr[c] - mx) / sum);
    }
  }

  void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                        bool accumulate) override {
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0.0;
      for (int64_t c = 0; c < cols; ++c) dot += static_cast<double>(dy[r * cols + c]) * y[r * cols + c];
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        store(dx, i, static_cast<double>(y[i]) * (dy[i] - dot), accumulate);
      }
    }
  }

  void logsumexp_forward(const float* x, float* y, int64_t rows, int64_t cols) override {
    for (int64_t r = 0; r < rows; ++r) {
      const auto [mx, sum] = max_and_exp_sum(x + r * cols, cols);
      y[r] = static_cast<float>(mx + std::log(sum));
    }
  }

  void logsumexp_backward(const float* x, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                          bool accumulate) override {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t i = r * cols + c;
        store(dx, i, static_cast<double>(dy[r]) * std::exp(static_cast<double>(x[i]) - y[r]), accumulate);
      }
  }

  void sum_forward(const float* x, float* y, int64_t n) override {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    y[0] = static_cast<float>(s);
  }

  void sum_backward(const float* dy, float* dx, int64_t n, bool accumulate) override {
    for (int64_t i = 0; i < n; ++i) store(dx, i, dy[0], accumulate);
  }

  void loss_reduce(const float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                   std::int32_t ignore_index, float scale, float z_loss_weight, float* out) override {
    double s = 0.0, z = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      s += losses[r];
      if (targets[r] != ignore_index) z += static_cast<double>(lse[r]) * lse[r];
    }
    float value = static_cast<float>(s * scale);
    if (z_loss_weight != 0.0f) value += static_cast<float>(z_loss_weight * z * scale);
    out[0] = value;
  }

  void z_loss_forward(float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                      std::int32_t ignore_index, float z_loss_weight) override {
    for (int64_t r = 0; r < rows; ++r)
      if (targets[r] != ignore_index)
        losses[r] = static_cast<float>(losses[r] + static_cast<double>(z_loss_weight) * lse[r] * lse[r]);
  }

  void z_loss_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse, float grad_scale,
                       float z_loss_weight, int64_t rows, int64_t vocab, std::int32_t ignore_index) override {
    for (int64_t r = 0; r < rows; ++r) {
      if (targets[r] == ignore_index) continue;
      const double twice = 2.0 * z_loss_weight * lse[r];
      float* row = logits + r * ld;
      for (int64_t j = 0; j < vocab; ++j) row[j] = static_cast<float>(row[j] * (1.0 + twice));
      row[targets[r]] = static_cast<float>(row[targets[r]] + grad_scale * twice);
    }
  }

 private:
  // Float64 accumulators, kept between calls so that a warmed-up step allocates nothing.
  static std::vector<double>& zeroed(std::vector<double>& v, int64_t n) {
    v.assign(static_cast<std::size_t>(n), 0.0);
    return v;
  }
  std::vector<double> sums_, dw_, db_, table_, seen_;
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Backend>(
      {.name = "reference",
       .description = "plain loops with float64 accumulation: the oracle every backend is tested against",
       .version = "1.0.0"},
      [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<ReferenceBackend>(); });
}

}  // namespace

LOOM_PLUGIN(register_components)
