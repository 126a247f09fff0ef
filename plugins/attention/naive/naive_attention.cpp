// attention/naive: the readable attention kernel. For each (batch, head) it materialises the
// whole [q_len, kv_len] score matrix, masks and softmaxes it row by row, and multiplies by the
// values, exactly as the contract (kinds/attention.hpp) writes the formula. The backward pass
// recomputes the probabilities from the saved log-sum-exp (the kernel keeps no state between
// calls: a model runs every layer's forward before any backward) and applies the softmax
// backward dS = P * (dP - rowsum(dO * O)).
//
// The matrix products are single-threaded cblas_sgemm calls on the strided operands; the
// parallelism is over (batch, head) through the execution context. It is the conformance
// suite's oracle for every other kernel, and the baseline `loom bench attention` compares with.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <loom/attention_mask.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/plugin.hpp>
#include <loom/tensor.hpp>
#include <memory>

namespace {

using std::int64_t;

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

// Pointers to the rows of one head: row t of the head starts at `data + t * ld`.
struct HeadView {
  const float* data;
  int64_t ld;
};
HeadView head(const loom::AttentionOperand& x, int64_t b, int64_t h, int64_t head_dim) {
  return {x.data + b * x.batch_stride + h * head_dim, x.token_stride};
}

blasint to_blas(int64_t n) {
  return static_cast<blasint>(n);
}

// scores[i, j] = scale * q_i . k_j, soft-capped: the logits before masking.
void compute_scores(const loom::AttentionForwardArgs& a, int64_t b, int64_t h, float* scores) {
  const int64_t g = h / (a.q_heads / a.kv_heads);
  const HeadView q = head(a.q, b, h, a.head_dim), k = head(a.k, b, g, a.head_dim);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, to_blas(a.q_len), to_blas(a.kv_len), to_blas(a.head_dim),
              a.params.scale, q.data, to_blas(q.ld), k.data, to_blas(k.ld), 0.0f, scores, to_blas(a.kv_len));
  const float cap = a.params.softcap;
  if (cap > 0.0f)
    for (int64_t e = 0; e < a.q_len * a.kv_len; ++e) scores[e] = cap * std::tanh(scores[e] / cap);
}

class NaiveAttention final : public loom::AttentionKernel {
 public:
  explicit NaiveAttention(loom::ExecutionContext& execution) : execution_(execution) {}

  void forward(const loom::AttentionForwardArgs& a) override {
    if (a.q_len == 0) return;  // nothing to write
    const int64_t out_ld = a.q_heads * a.head_dim;
    const loom::AttentionMask mask(a);
    execution_.parallel_for(a.batch * a.q_heads, 1, [&](int64_t begin, int64_t end) {
      // The score matrix of one (batch, head), reused by every pair of this chunk.
      loom::Tensor scratch = loom::Tensor::empty(loom::Shape{a.q_len, a.kv_len});
      float* p = scratch.data<float>();
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / a.q_heads, h = bh % a.q_heads;
        compute_scores(a, b, h, p);
        float* lse = a.lse + bh * a.q_len;
        for (int64_t i = 0; i < a.q_len; ++i) {
          float* row = p + i * a.kv_len;
          float max = negative_infinity;
          for (int64_t j = 0; j < a.kv_len; ++j) {
            if (!mask.visible(b, i, j)) row[j] = negative_infinity;
            max = std::max(max, row[j]);
          }
          if (max == negative_infinity) {  // no visible key: out 0, lse -inf
            for (int64_t j = 0; j < a.kv_len; ++j) row[j] = 0.0f;
            lse[i] = negative_infinity;
            continue;
          }
          double sum = 0.0;
          for (int64_t j = 0; j < a.kv_len; ++j) {
            row[j] = std::exp(row[j] - max);
            sum += row[j];
          }
          const float inverse = static_cast<float>(1.0 / sum);
          for (int64_t j = 0; j < a.kv_len; ++j) row[j] *= inverse;
          lse[i] = max + static_cast<float>(std::log(sum));
        }
        // out = P V
        const HeadView v = head(a.v, b, h / (a.q_heads / a.kv_heads), a.head_dim);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(a.q_len), to_blas(a.head_dim), to_blas(a.kv_len),
                    1.0f, p, to_blas(a.kv_len), v.data, to_blas(v.ld), 0.0f,
                    a.out + b * a.q_len * out_ld + h * a.head_dim, to_blas(out_ld));
      }
    });
  }

  void backward(const loom::AttentionBackwardArgs& args) override {
    const loom::AttentionForwardArgs& a = *args.forward;
    const int64_t group = a.q_heads / a.kv_heads;
    const int64_t out_ld = a.q_heads * a.head_dim;
    const blasint m = to_blas(a.q_len), n = to_blas(a.kv_len), d = to_blas(a.head_dim);
    const loom::AttentionMask mask(a);
    if (a.q_len == 0) {  // no query: dk and dv are sums of nothing
      for (const loom::AttentionGradient* grad : {&args.dk, &args.dv}) {
        if (grad->data == nullptr || grad->accumulate) continue;
        for (int64_t b = 0; b < a.batch; ++b)
          for (int64_t j = 0; j < a.kv_len; ++j)
            std::fill_n(grad->data + b * grad->batch_stride + j * grad->token_stride, a.kv_heads * a.head_dim, 0.0f);
      }
      return;
    }
    // One task per (batch, kv head): the heads of a group add into the same dk and dv rows, so
    // they run in order on one thread, which keeps the sum race-free and deterministic.
    execution_.parallel_for(a.batch * a.kv_heads, 1, [&](int64_t begin, int64_t end) {
      loom::Tensor scratch = loom::Tensor::empty(loom::Shape{2, a.q_len, a.kv_len});
      float* p = scratch.data<float>();    // probabilities P
      float* ds = p + a.q_len * a.kv_len;  // dP, then the score gradient dS
      loom::Tensor delta_buffer = loom::Tensor::empty(loom::Shape{a.q_len});
      float* delta = delta_buffer.data<float>();  // D_i = rowsum(dO_i * O_i)
      for (int64_t bg = begin; bg < end; ++bg) {
        const int64_t b = bg / a.kv_heads, g = bg % a.kv_heads;
        const HeadView k = head(a.k, b, g, a.head_dim), v = head(a.v, b, g, a.head_dim);
        for (int64_t h = g * group; h < (g + 1) * group; ++h) {
          const int64_t head_offset = b * a.q_len * out_ld + h * a.head_dim;
          const float* out = a.out + head_offset;
          const float* dout = args.dout + head_offset;
          const float* lse = a.lse + (b * a.q_heads + h) * a.q_len;
          for (int64_t i = 0; i < a.q_len; ++i) {
            double sum = 0.0;
            for (int64_t e = 0; e < a.head_dim; ++e) sum += double{dout[i * out_ld + e]} * out[i * out_ld + e];
            delta[i] = static_cast<float>(sum);
          }
          compute_scores(a, b, h, p);
          // dP = dO V^T
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, d, 1.0f, dout, to_blas(out_ld), v.data,
                      to_blas(v.ld), 0.0f, ds, n);
          const float cap = a.params.softcap;
          for (int64_t i = 0; i < a.q_len; ++i)
            for (int64_t j = 0; j < a.kv_len; ++j) {
              const int64_t e = i * a.kv_len + j;
              const float logit = p[e];
              const float prob = lse[i] != negative_infinity && mask.visible(b, i, j) ? std::exp(logit - lse[i]) : 0.0f;
              float grad = prob * (ds[e] - delta[i]);
              if (cap > 0.0f) {  // d/ds cap * tanh(s / cap) = 1 - tanh^2
                const float t = logit / cap;
                grad *= 1.0f - t * t;
              }
              p[e] = prob;
              ds[e] = grad;
            }
          // The first head of a group overwrites dk/dv unless told to accumulate; the rest add.
          const bool first = h == g * group;
          if (args.dv.data != nullptr) {  // dV += P^T dO
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, m, 1.0f, p, n, dout, to_blas(out_ld),
                        first && !args.dv.accumulate ? 0.0f : 1.0f,
                        args.dv.data + b * args.dv.batch_stride + g * a.head_dim, to_blas(args.dv.token_stride));
          }
          if (args.dk.data != nullptr) {  // dK += scale dS^T Q
            const HeadView q = head(a.q, b, h, a.head_dim);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, d, m, a.params.scale, ds, n, q.data, to_blas(q.ld),
                        first && !args.dk.accumulate ? 0.0f : 1.0f,
                        args.dk.data + b * args.dk.batch_stride + g * a.head_dim, to_blas(args.dk.token_stride));
          }
          if (args.dq.data != nullptr) {  // dQ = scale dS K
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, d, n, a.params.scale, ds, n, k.data,
                        to_blas(k.ld), args.dq.accumulate ? 1.0f : 0.0f,
                        args.dq.data + b * args.dq.batch_stride + h * a.head_dim, to_blas(args.dq.token_stride));
          }
        }
      }
    });
  }

 private:
  loom::ExecutionContext& execution_;
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::AttentionKernel>(
      {.name = "naive",
       .description = "materialises each head's score matrix; the readable reference kernel",
       .version = "1.0.0",
       .preference = 10},  // the reference: chosen by `auto` only where no faster kernel is loaded
      [](const loom::Options&, const loom::CreateContext& context) {
        return std::make_unique<NaiveAttention>(context.execution());
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
