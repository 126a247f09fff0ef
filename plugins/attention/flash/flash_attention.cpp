// attention/flash: tiled attention with an online softmax (FlashAttention-2, Dao 2023) on the
// CPU.
//
// Forward: for each (batch, head, query tile) the key/value tiles stream past the query tile;
// each score tile S = scale Q_i K_j^T lives only in a block_q x block_kv scratch buffer, the
// running row maximum m and sum l are rescaled as the maximum grows, and out accumulates P V_j
// in place. The log-sum-exp m + log l is saved for the backward pass. Tiles that the causal
// mask, the window or the segment ids hide completely are skipped.
//
// Backward: recomputation (FlashAttention-2's algorithm 2). D_i = rowsum(dO_i * O_i) first;
// then for each key tile the query tiles that see it are revisited, P is recomputed from the
// saved log-sum-exp, and dV_j += P^T dO_i, dS = P * (dO_i V_j^T - D_i), dK_j += scale dS^T Q_i,
// dQ_i += scale dS K_j. Extra memory: D ([batch, q_heads, q_len]) and a few tiles per thread;
// never a [len, len] buffer.
//
// Parallelism and determinism. The forward runs (batch, head, query tile) items in parallel;
// each writes its own rows. The backward runs (batch, kv head, key-tile stripe) items: all the
// heads of a group and every query tile are visited in a fixed order inside one item, so dK and
// dV rows have a single writer and a fixed summation order. dQ rows receive contributions from
// every key tile; with one stripe per (batch, kv head) the item adds them in key order straight
// into dq, and when there are too few (batch, kv head) pairs to occupy the threads, each stripe
// adds into its own dq partial and the partials are summed in stripe order afterwards. Either
// way the result depends only on the inputs and the thread count.
//
// Tiles: the GEMMs on tiles are single-threaded cblas_sgemm calls on the strided operands. The
// products with K^T and V^T (S = Q K^T, dP = dO V^T) use an explicitly transposed key/value
// tile: row-major A B^T is OpenBLAS's column-major "TN" case, which its small-matrix kernels do
// not take, and its general path (packing both operands) costs about twice as much on tiles of
// this size; a 64 x 64 transpose in registers costs a few percent of one product. With block_q = block_kv = 64 and
// head_dim 64 a query tile, a key tile, a value tile, the score tile and the output tile take 80 KiB, inside the 1 MiB
// L2 of a core of this machine (and the score tile alone fits the 32 KiB L1).
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <loom/attention_mask.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/plugin.hpp>
#include <loom/tensor.hpp>
#include <memory>

#include "row_math.hpp"

namespace {

using std::int64_t;
namespace rows = loom::flash;

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

blasint to_blas(int64_t n) {
  return static_cast<blasint>(n);
}

// Zeroes `count` rows of `width` floats, `ld` apart.
void zero_rows(float* data, int64_t count, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < count; ++r) std::memset(data + r * ld, 0, sizeof(float) * static_cast<size_t>(width));
}

class FlashAttention final : public loom::AttentionKernel {
 public:
  FlashAttention(loom::ExecutionContext& execution, int64_t block_q, int64_t block_kv)
      : execution_(execution), block_q_(block_q), block_kv_(block_kv) {}

  void forward(const loom::AttentionForwardArgs& a) override {
    if (a.batch == 0 || a.q_heads == 0 || a.q_len == 0) return;
    const int64_t q_tiles = (a.q_len + block_q_ - 1) / block_q_;
    const int64_t items = a.batch * a.q_heads * q_tiles;
    execution_.parallel_for(items, 1, [&](int64_t begin, int64_t end) {
      loom::Tensor scratch =
          loom::Tensor::empty(loom::Shape{block_q_ * block_kv_ + a.head_dim * block_kv_ + 2 * block_q_});
      float* scores = scratch.data<float>();
      float* keys_t = scores + block_q_ * block_kv_;
      float* max = keys_t + a.head_dim * block_kv_;
      float* sum = max + block_q_;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t bh = item / q_tiles;
        forward_tile(a, bh / a.q_heads, bh % a.q_heads, balanced_tile(item % q_tiles, q_tiles), scores, keys_t, max,
                     sum);
      }
    });
  }

  void backward(const loom::AttentionBackwardArgs& args) override {
    const loom::AttentionForwardArgs& a = *args.forward;
    const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr, want_dv = args.dv.data != nullptr;
    if (a.batch == 0 || a.kv_heads == 0 || (!want_dq && !want_dk && !want_dv)) return;
    const int64_t d = a.head_dim, group = a.q_heads / a.kv_heads, out_ld = a.q_heads * d;
    const int64_t q_tiles = (a.q_len + block_q_ - 1) / block_q_, kv_tiles = (a.kv_len + block_kv_ - 1) / block_kv_;

    // D_i = rowsum(dO_i * O_i), [batch, q_heads, q_len].
    loom::Tensor delta_buffer = loom::Tensor::empty(loom::Shape{a.batch, a.q_heads, a.q_len});
    float* delta = delta_buffer.data<float>();
    execution_.parallel_for(a.batch * a.q_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / a.q_heads, h = bh % a.q_heads;
        for (int64_t i = 0; i < a.q_len; ++i) {
          const int64_t row = (b * a.q_len + i) * out_ld + h * d;
          delta[bh * a.q_len + i] = rows::dot(args.dout + row, a.out + row, d);
        }
      }
    });

    // Stripes of key tiles per (batch, kv head): enough items to occupy every thread.
    const int64_t pairs = a.batch * a.kv_heads;
    const int64_t wanted = 4 * static_cast<int64_t>(execution_.num_threads());
    const int64_t stripes =
        want_dq ? std::clamp<int64_t>((wanted + pairs - 1) / pairs, 1, std::max<int64_t>(kv_tiles, 1)) : 1;
    loom::Tensor partial_buffer;  // [stripes, batch, q_heads, q_len, head_dim] when stripes > 1
    if (stripes > 1) partial_buffer = loom::Tensor::empty(loom::Shape{stripes, a.batch, a.q_heads, a.q_len, d});
    float* partials = stripes > 1 ? partial_buffer.data<float>() : nullptr;

    execution_.parallel_for(pairs * stripes, 1, [&](int64_t begin, int64_t end) {
      const int64_t tile = block_q_ * block_kv_, operand = d * block_kv_;
      loom::Tensor scratch = loom::Tensor::empty(loom::Shape{3 * tile + 2 * operand});
      float* base = scratch.data<float>();
      BackwardTiles tiles{base, base + tile, base + 2 * tile, base + 3 * tile, base + 3 * tile + operand};
      for (int64_t item = begin; item < end; ++item) {
        const int64_t pair = item / stripes, stripe = item % stripes;
        const int64_t b = pair / a.kv_heads, g = pair % a.kv_heads;
        // Where this item's dQ contributions go: dq itself, or the stripe's partial.
        DqTarget dq{nullptr, 0, 0};
        if (want_dq && stripes == 1) {
          dq = {args.dq.data + b * args.dq.batch_stride, args.dq.token_stride, 0};
          if (!args.dq.accumulate)
            for (int64_t h = g * group; h < (g + 1) * group; ++h)
              zero_rows(dq.data + h * d, a.q_len, d, dq.token_stride);
        } else if (want_dq) {
          dq = {partials + ((stripe * a.batch + b) * a.q_heads) * a.q_len * d, d, a.q_len * d};
          zero_rows(dq.data + g * group * a.q_len * d, group * a.q_len, d, d);
        }
        for (int64_t kt = stripe; kt < kv_tiles; kt += stripes)
          backward_key_tile(args, b, g, kt, q_tiles, delta, dq, tiles);
      }
    });

    if (stripes > 1) {  // dq (+)= the partials, summed in stripe order
      execution_.parallel_for(a.batch * a.q_heads, 1, [&](int64_t begin, int64_t end) {
        for (int64_t bh = begin; bh < end; ++bh) {
          const int64_t b = bh / a.q_heads, h = bh % a.q_heads;
          for (int64_t i = 0; i < a.q_len; ++i) {
            float* target = args.dq.data + b * args.dq.batch_stride + i * args.dq.token_stride + h * d;
            for (int64_t e = 0; e < d; ++e) {
              float sum = args.dq.accumulate ? target[e] : 0.0f;
              for (int64_t s = 0; s < stripes; ++s)
                sum += partials[(((s * a.batch + b) * a.q_heads + h) * a.q_len + i) * d + e];
              target[e] = sum;
            }
          }
        }
      });
    }
  }

 private:
  struct BackwardTiles {
    float* capped;  // soft-capped scores (read for the cap's derivative)
    float* probs;   // P, recomputed from the log-sum-exp
    float* grads;   // dP, then dS
    float* keys_t;  // K_j^T and V_j^T (head_dim x block_kv)
    float* values_t;
  };
  // dQ of head h, row i of one batch element starts at data + i * token_stride + h * head_stride
  // (head_stride 0 means the heads sit within a token: offset h * head_dim).
  struct DqTarget {
    float* data;
    int64_t token_stride;
    int64_t head_stride;
  };

  // Query tiles in the order 0, n-1, 1, n-2, ...: under a causal mask the cost of a tile grows
  // with its index, so consecutive items pair a cheap tile with a dear one and the equal-length
  // chunks of parallel_for carry similar work.
  static int64_t balanced_tile(int64_t k, int64_t n) { return k % 2 == 0 ? k / 2 : n - 1 - k / 2; }

  void forward_tile(const loom::AttentionForwardArgs& a, int64_t b, int64_t h, int64_t qt, float* scores, float* keys_t,
                    float* max, float* sum) const {
    const loom::AttentionMask mask(a);
    const int64_t d = a.head_dim, g = h / (a.q_heads / a.kv_heads);
    const int64_t i0 = qt * block_q_, count = std::min(block_q_, a.q_len - i0);
    const float* q = a.q.data + b * a.q.batch_stride + i0 * a.q.token_stride + h * d;
    const int64_t out_ld = a.q_heads * d;
    float* out = a.out + (b * a.q_len + i0) * out_ld + h * d;
    float* lse = a.lse + (b * a.q_heads + h) * a.q_len + i0;
    zero_rows(out, count, d, out_ld);
    std::fill(max, max + count, negative_infinity);
    std::fill(sum, sum + count, 0.0f);

    const int64_t kv_tiles = (a.kv_len + block_kv_ - 1) / block_kv_;
    for (int64_t kt = 0; kt < kv_tiles; ++kt) {
      const int64_t j0 = kt * block_kv_, cols = std::min(block_kv_, a.kv_len - j0);
      const loom::MaskCover cover = mask.cover(b, i0, i0 + count, j0, j0 + cols);
      if (cover == loom::MaskCover::none) continue;
      const float* k = a.k.data + b * a.k.batch_stride + j0 * a.k.token_stride + g * d;
      const float* v = a.v.data + b * a.v.batch_stride + j0 * a.v.token_stride + g * d;
      // S = scale Q K^T, as Q times an explicit K^T (see the comment at the top).
      rows::transpose(k, cols, d, a.k.token_stride, keys_t, block_kv_);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(d), a.params.scale,
                  q, to_blas(a.q.token_stride), keys_t, to_blas(block_kv_), 0.0f, scores, to_blas(block_kv_));
      for (int64_t r = 0; r < count; ++r) {
        float* row = scores + r * block_kv_;
        if (a.params.softcap > 0.0f) rows::softcap_row(row, cols, a.params.softcap);
        if (cover == loom::MaskCover::partial) mask.apply(b, i0 + r, j0, cols, row, negative_infinity);
        const float new_max = std::max(max[r], rows::row_max(row, cols));
        if (new_max == negative_infinity) {  // nothing visible yet: P = 0
          std::fill(row, row + cols, 0.0f);
          continue;
        }
        const float rescale = max[r] == negative_infinity ? 0.0f : std::exp(max[r] - new_max);
        sum[r] = sum[r] * rescale + rows::exp_shift_sum(row, cols, new_max);
        max[r] = new_max;
        if (rescale != 1.0f) rows::scale_row(out + r * out_ld, d, rescale);
      }
      // out += P V
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(d), to_blas(cols), 1.0f, scores,
                  to_blas(block_kv_), v, to_blas(a.v.token_stride), 1.0f, out, to_blas(out_ld));
    }
    for (int64_t r = 0; r < count; ++r) {
      if (sum[r] == 0.0f) {  // no visible key: out stays 0
        lse[r] = negative_infinity;
        continue;
      }
      rows::scale_row(out + r * out_ld, d, 1.0f / sum[r]);
      lse[r] = max[r] + std::log(sum[r]);
    }
  }

  // Key tile kt of kv head g: dK and dV rows complete, dQ contributions added to `dq`.
  void backward_key_tile(const loom::AttentionBackwardArgs& args, int64_t b, int64_t g, int64_t kt, int64_t q_tiles,
                         const float* delta, const DqTarget& dq, const BackwardTiles& tiles) const {
    const loom::AttentionForwardArgs& a = *args.forward;
    const loom::AttentionMask mask(a);
    const int64_t d = a.head_dim, group = a.q_heads / a.kv_heads, out_ld = a.q_heads * d;
    const int64_t j0 = kt * block_kv_, cols = std::min(block_kv_, a.kv_len - j0);
    const float cap = a.params.softcap;
    const float* k = a.k.data + b * a.k.batch_stride + j0 * a.k.token_stride + g * d;
    const float* v = a.v.data + b * a.v.batch_stride + j0 * a.v.token_stride + g * d;
    float* dk = args.dk.data ? args.dk.data + b * args.dk.batch_stride + j0 * args.dk.token_stride + g * d : nullptr;
    float* dv = args.dv.data ? args.dv.data + b * args.dv.batch_stride + j0 * args.dv.token_stride + g * d : nullptr;
    if (dk && !args.dk.accumulate) zero_rows(dk, cols, d, args.dk.token_stride);
    if (dv && !args.dv.accumulate) zero_rows(dv, cols, d, args.dv.token_stride);
    const blasint bk = to_blas(block_kv_);
    rows::transpose(k, cols, d, a.k.token_stride, tiles.keys_t, block_kv_);
    rows::transpose(v, cols, d, a.v.token_stride, tiles.values_t, block_kv_);

    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* lse = a.lse + (b * a.q_heads + h) * a.q_len;
      const float* row_delta = delta + (b * a.q_heads + h) * a.q_len;
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        const int64_t i0 = qt * block_q_, count = std::min(block_q_, a.q_len - i0);
        const loom::MaskCover cover = mask.cover(b, i0, i0 + count, j0, j0 + cols);
        if (cover == loom::MaskCover::none) continue;
        const float* q = a.q.data + b * a.q.batch_stride + i0 * a.q.token_stride + h * d;
        const float* dout = args.dout + (b * a.q_len + i0) * out_ld + h * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(d),
                    a.params.scale, q, to_blas(a.q.token_stride), tiles.keys_t, bk, 0.0f, tiles.capped, bk);
        for (int64_t r = 0; r < count; ++r) {
          float* capped = tiles.capped + r * block_kv_;
          float* p = tiles.probs + r * block_kv_;
          if (cap > 0.0f) rows::softcap_row(capped, cols, cap);
          if (lse[i0 + r] == negative_infinity) {  // the row sees no key: no gradient
            std::fill(p, p + cols, 0.0f);
            continue;
          }
          rows::exp_shift(capped, p, cols, lse[i0 + r]);
          if (cover == loom::MaskCover::partial) mask.apply(b, i0 + r, j0, cols, p, 0.0f);
        }
        if (dv)  // dV += P^T dO
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_blas(cols), to_blas(d), to_blas(count), 1.0f,
                      tiles.probs, bk, dout, to_blas(out_ld), 1.0f, dv, to_blas(args.dv.token_stride));
        if (!dk && !dq.data) continue;
        // dP = dO V^T, then dS = P (dP - D) (times the cap's derivative)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(d), 1.0f, dout,
                    to_blas(out_ld), tiles.values_t, bk, 0.0f, tiles.grads, bk);
        for (int64_t r = 0; r < count; ++r)
          rows::softmax_grad_row(tiles.grads + r * block_kv_, tiles.probs + r * block_kv_, tiles.capped + r * block_kv_,
                                 cols, row_delta[i0 + r], cap);
        if (dq.data) {  // dQ += scale dS K
          float* target = dq.data + (dq.head_stride == 0 ? h * d : h * dq.head_stride) + i0 * dq.token_stride;
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(d), to_blas(cols),
                      a.params.scale, tiles.grads, bk, k, to_blas(a.k.token_stride), 1.0f, target,
                      to_blas(dq.token_stride));
        }
        if (dk)  // dK += scale dS^T Q
          cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_blas(cols), to_blas(d), to_blas(count),
                      a.params.scale, tiles.grads, bk, q, to_blas(a.q.token_stride), 1.0f, dk,
                      to_blas(args.dk.token_stride));
      }
    }
  }

  loom::ExecutionContext& execution_;
  int64_t block_q_, block_kv_;
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("block_q", 64, "Query rows per tile (the score tile is block_q x block_kv floats).").range(4, 1024);
  s.integer("block_kv", 64, "Keys per tile.").range(4, 1024);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::AttentionKernel>(
      {.name = "flash",
       .description = "tiled attention with an online softmax and a recomputing backward (FlashAttention-2)",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext& context) {
        return std::make_unique<FlashAttention>(context.execution(), o.get<std::int64_t>("block_q"),
                                                o.get<std::int64_t>("block_kv"));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
