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
//
// Mixed precision (AttentionForwardArgs::compute == bf16, on a CPU with AVX512-BF16): the tile
// products take bf16 operands and accumulate in float32 (bf16_tiles.hpp); everything else is the
// float32 code, shared: forward_tile and backward_key_tile are templates over their tile products
// (F32ForwardTiles / F32BackwardTiles, the cblas_sgemm calls described above, and
// Bf16ForwardTiles / Bf16BackwardTiles). Each operand tile is rounded to bf16 once where it can
// be shared: the forward keeps the bf16 key and value tiles of the (batch, kv head) it is working
// on for all its query tiles, the backward the bf16 query and output-gradient tiles of the
// (batch, kv head) for all its key tiles; P and dS are rounded as they enter their products. D
// takes dO rounded (Bf16BackwardTiles::delta). Otherwise (f32 asked, or no AVX512-BF16) the
// float32 path runs, the same bits as before the bf16 path existed. Determinism is unchanged:
// the bf16 products sum in a fixed order, and the work is split as in float32.
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

#include "bf16_tiles.hpp"
#include "row_math.hpp"

namespace {

using std::int64_t;
using std::uint32_t;
namespace rows = loom::flash;
namespace bf16 = loom::flash::bf16;

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

blasint to_blas(int64_t n) {
  return static_cast<blasint>(n);
}

// Zeroes `count` rows of `width` floats, `ld` apart.
void zero_rows(float* data, int64_t count, int64_t width, int64_t ld) {
  for (int64_t r = 0; r < count; ++r) std::memset(data + r * ld, 0, sizeof(float) * static_cast<size_t>(width));
}

uint32_t* words(loom::Tensor& t) {
  return reinterpret_cast<uint32_t*>(t.data<std::int32_t>());
}

// ---------------------------------------------------------------------------------------------
// The forward pass's tile products, float32 and bf16. Each object is one thread's scratch for a
// chunk of work items: `scores` (block_q x block_kv), the running row `max` and `sum`, and what
// its products need. forward_tile calls begin() once per query tile, then for each key tile it
// does not skip scores() (S = scale Q K_j^T into `scores`) and, once `scores` holds P, add_pv()
// (out += P V_j).

class F32ForwardTiles {
 public:
  F32ForwardTiles(const loom::AttentionForwardArgs& a, int64_t block_q, int64_t block_kv)
      : scratch_(loom::Tensor::empty(loom::Shape{block_q * block_kv + a.head_dim * block_kv + 2 * block_q})),
        block_kv_(block_kv) {
    scores = scratch_.data<float>();
    keys_t_ = scores + block_q * block_kv;
    max = keys_t_ + a.head_dim * block_kv;
    sum = max + block_q;
  }
  void begin(const loom::AttentionForwardArgs&, int64_t, int64_t, const float*, int64_t) {}
  // As Q times an explicit K^T (see the comment at the top).
  void scores_tile(const loom::AttentionForwardArgs& a, const float* q, int64_t count, const float* k, int64_t,
                   int64_t cols) {
    rows::transpose(k, cols, a.head_dim, a.k.token_stride, keys_t_, block_kv_);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(a.head_dim),
                a.params.scale, q, to_blas(a.q.token_stride), keys_t_, to_blas(block_kv_), 0.0f, scores,
                to_blas(block_kv_));
  }
  void add_pv(const loom::AttentionForwardArgs& a, int64_t count, const float* v, int64_t, int64_t cols, float* out,
              int64_t out_ld) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(a.head_dim), to_blas(cols), 1.0f,
                scores, to_blas(block_kv_), v, to_blas(a.v.token_stride), 1.0f, out, to_blas(out_ld));
  }

  float *scores, *max, *sum;

 private:
  loom::Tensor scratch_;
  float* keys_t_;
  int64_t block_kv_;
};

// bf16: the query tile is rounded once per begin(); the key and value tiles of the current
// (batch, kv head) once each, the first time a query tile reads them, and kept for the items of
// the chunk that follow (items run query tiles of one head after another, and the heads of a
// group share their keys). Layouts: Q and P in rows, K in column pairs, V in row pairs.
class Bf16ForwardTiles {
 public:
  Bf16ForwardTiles(const loom::AttentionForwardArgs& a, int64_t block_q, int64_t block_kv)
      : block_kv_(block_kv),
        d_pairs_(bf16::pairs_of(a.head_dim)),
        kv_pairs_(bf16::pairs_of(block_kv)),
        kv_width_(bf16::padded_width(block_kv)),
        d_width_(bf16::padded_width(a.head_dim)),
        key_words_(d_pairs_ * kv_width_),
        value_words_(kv_pairs_ * d_width_),
        kv_tiles_((a.kv_len + block_kv - 1) / block_kv) {
    floats_ = loom::Tensor::empty(loom::Shape{block_q * block_kv + 2 * block_q});
    scores = floats_.data<float>();
    max = scores + block_q * block_kv;
    sum = max + block_q;
    words_ = loom::Tensor::empty(
        loom::Shape{block_q * d_pairs_ + block_q * kv_pairs_ + kv_tiles_ * (key_words_ + value_words_) + kv_tiles_},
        loom::DType::i32);
    q_ = words(words_);
    p_ = q_ + block_q * d_pairs_;
    keys_ = p_ + block_q * kv_pairs_;
    values_ = keys_ + kv_tiles_ * key_words_;
    ready_ = values_ + kv_tiles_ * value_words_;
  }
  void begin(const loom::AttentionForwardArgs& a, int64_t b, int64_t g, const float* q, int64_t count) {
    if (b != b_ || g != g_) {
      std::fill(ready_, ready_ + kv_tiles_, 0u);
      b_ = b;
      g_ = g;
    }
    bf16::pack_rows(q, count, a.head_dim, a.q.token_stride, q_, d_pairs_);
  }
  void scores_tile(const loom::AttentionForwardArgs& a, const float*, int64_t count, const float* k, int64_t kt,
                   int64_t cols) {
    uint32_t* keys = keys_ + kt * key_words_;
    if (ready_[kt] == 0) {
      const float* v = a.v.data + b_ * a.v.batch_stride + kt * block_kv_ * a.v.token_stride + g_ * a.head_dim;
      bf16::pack_column_pairs(k, cols, a.head_dim, a.k.token_stride, keys, kv_width_);
      bf16::pack_row_pairs(v, cols, a.head_dim, a.v.token_stride, values_ + kt * value_words_, d_width_);
      ready_[kt] = 1;
    }
    bf16::product(q_, d_pairs_, 1, count, keys, kv_width_, cols, d_pairs_, a.params.scale, false, scores, block_kv_);
  }
  void add_pv(const loom::AttentionForwardArgs& a, int64_t count, const float*, int64_t kt, int64_t cols, float* out,
              int64_t out_ld) {
    bf16::pack_rows(scores, count, cols, block_kv_, p_, kv_pairs_);
    bf16::product(p_, kv_pairs_, 1, count, values_ + kt * value_words_, d_width_, a.head_dim, bf16::pairs_of(cols),
                  1.0f, true, out, out_ld);
  }

  float *scores, *max, *sum;

 private:
  int64_t block_kv_, d_pairs_, kv_pairs_, kv_width_, d_width_, key_words_, value_words_, kv_tiles_;
  loom::Tensor floats_, words_;
  uint32_t *q_, *p_, *keys_, *values_, *ready_;
  int64_t b_ = -1, g_ = -1;
};

// ---------------------------------------------------------------------------------------------
// The backward pass's tile products. Scratch: `capped` (soft-capped scores, read for the cap's
// derivative), `probs` (P, recomputed from the log-sum-exp) and `grads` (dP, then dS), each
// block_q x block_kv. backward_key_tile calls key_tile() once per key tile, query_tile() once per
// (head, query tile) it visits, then scores() (into `capped`), add_dv() (dV += P^T dO), dp()
// (dP = dO V^T into `grads`), and with dS in `grads` add_dq() (dQ += scale dS K) and add_dk()
// (dK += scale dS^T Q).

class F32BackwardTiles {
 public:
  F32BackwardTiles(const loom::AttentionBackwardArgs& args, int64_t block_q, int64_t block_kv, int64_t)
      : block_kv_(block_kv) {
    const int64_t tile = block_q * block_kv, operand = args.forward->head_dim * block_kv;
    scratch_ = loom::Tensor::empty(loom::Shape{3 * tile + 2 * operand});
    capped = scratch_.data<float>();
    probs = capped + tile;
    grads = probs + tile;
    keys_t_ = grads + tile;
    values_t_ = keys_t_ + operand;
  }
  static float delta(const float* dout, const float* out, int64_t d) { return rows::dot(dout, out, d); }
  // K_j^T and V_j^T for the products with K^T and V^T (see the comment at the top).
  void key_tile(const loom::AttentionForwardArgs& a, const float* k, const float* v, int64_t cols) {
    rows::transpose(k, cols, a.head_dim, a.k.token_stride, keys_t_, block_kv_);
    rows::transpose(v, cols, a.head_dim, a.v.token_stride, values_t_, block_kv_);
  }
  void query_tile(const loom::AttentionBackwardArgs&, int64_t, int64_t, int64_t, int64_t, const float*, const float*,
                  int64_t) {}
  void scores(const loom::AttentionForwardArgs& a, const float* q, int64_t count, int64_t cols) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(a.head_dim),
                a.params.scale, q, to_blas(a.q.token_stride), keys_t_, to_blas(block_kv_), 0.0f, capped,
                to_blas(block_kv_));
  }
  void add_dv(const loom::AttentionForwardArgs& a, const float* dout, int64_t out_ld, int64_t count, int64_t cols,
              float* dv, int64_t ld) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_blas(cols), to_blas(a.head_dim), to_blas(count), 1.0f,
                probs, to_blas(block_kv_), dout, to_blas(out_ld), 1.0f, dv, to_blas(ld));
  }
  void dp(const loom::AttentionForwardArgs& a, const float* dout, int64_t out_ld, int64_t count, int64_t cols) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(cols), to_blas(a.head_dim), 1.0f,
                dout, to_blas(out_ld), values_t_, to_blas(block_kv_), 0.0f, grads, to_blas(block_kv_));
  }
  void add_dq(const loom::AttentionForwardArgs& a, const float* k, int64_t count, int64_t cols, float* dq, int64_t ld) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, to_blas(count), to_blas(a.head_dim), to_blas(cols),
                a.params.scale, grads, to_blas(block_kv_), k, to_blas(a.k.token_stride), 1.0f, dq, to_blas(ld));
  }
  void add_dk(const loom::AttentionForwardArgs& a, const float* q, int64_t count, int64_t cols, float* dk, int64_t ld) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, to_blas(cols), to_blas(a.head_dim), to_blas(count),
                a.params.scale, grads, to_blas(block_kv_), q, to_blas(a.q.token_stride), 1.0f, dk, to_blas(ld));
  }

  float *capped, *probs, *grads;

 private:
  loom::Tensor scratch_;
  float *keys_t_, *values_t_;
  int64_t block_kv_;
};

// bf16: a key tile is rounded once per key_tile() (K in column pairs for Q K^T and in row pairs
// for dS K, V in column pairs for dO V^T) and serves every head of the group and every query
// tile. The query and output-gradient tiles of the current (batch, kv head) are rounded the first
// time query_tile() meets them (Q in rows for Q K^T and in row pairs for dS^T Q, dO in rows for
// dO V^T and in row pairs for P^T dO) and kept for the later key tiles, within bf16_cache_mib
// (16 MiB a thread by default: a group of 8 heads of 128 at 2048 tokens); beyond that they are
// rounded at every use. P and dS are rounded as
// they enter a product (row pairs for P^T dO and dS^T Q, rows for dS K).
class Bf16BackwardTiles {
 public:
  Bf16BackwardTiles(const loom::AttentionBackwardArgs& args, int64_t block_q, int64_t block_kv, int64_t cache_bytes)
      : block_kv_(block_kv),
        d_pairs_(bf16::pairs_of(args.forward->head_dim)),
        kv_pairs_(bf16::pairs_of(block_kv)),
        q_pairs_(bf16::pairs_of(block_q)),
        kv_width_(bf16::padded_width(block_kv)),
        d_width_(bf16::padded_width(args.forward->head_dim)),
        rows_words_(block_q * d_pairs_),
        pairs_words_(q_pairs_ * d_width_),
        q_tiles_((args.forward->q_len + block_q - 1) / block_q),
        group_(args.forward->q_heads / args.forward->kv_heads) {
    const int64_t tile = block_q * block_kv;
    floats_ = loom::Tensor::empty(loom::Shape{3 * tile});
    capped = floats_.data<float>();
    probs = capped + tile;
    grads = probs + tile;
    // Key tile: K in column pairs and in row pairs, V in column pairs; P / dS in row pairs, dS in
    // rows; per (head of the group, query tile): Q and dO in rows and in row pairs; ready flags.
    // The cache holds every query tile of the group (8 group q_len head_dim bytes) up to
    // cache_bytes (option bf16_cache_mib); past that, one entry, rounded again at each use.
    const int64_t key_words = 2 * d_pairs_ * kv_width_ + kv_pairs_ * d_width_;
    const int64_t all = group_ * q_tiles_, entry_bytes = 8 * (rows_words_ + pairs_words_);
    cache_all_ = all * entry_bytes <= cache_bytes;
    const int64_t entries = cache_all_ ? all : 1;
    words_ = loom::Tensor::empty(loom::Shape{key_words + q_pairs_ * kv_width_ + block_q * kv_pairs_ +
                                             entries * 2 * (rows_words_ + pairs_words_) + entries},
                                 loom::DType::i32);
    keys_ = words(words_);
    values_ = keys_ + d_pairs_ * kv_width_;
    keys_by_rows_ = values_ + d_pairs_ * kv_width_;
    transposed_ = keys_by_rows_ + kv_pairs_ * d_width_;
    ds_rows_ = transposed_ + q_pairs_ * kv_width_;
    cache_ = ds_rows_ + block_q * kv_pairs_;
    ready_ = cache_ + entries * 2 * (rows_words_ + pairs_words_);
    entries_ = entries;
  }
  // D = rowsum(bf16(dO) * O): with dO rounded as in dP = dO V^T, so that dP - D cancels where the
  // exact gradient of the scores is zero (a row with one visible key: P = 1, O = V), as it does in
  // float32; with float32 dO, the difference would be dO's rounding, of order u |dO| |V|.
  static float delta(const float* dout, const float* out, int64_t d) { return bf16::dot_rounded(dout, out, d); }
  void key_tile(const loom::AttentionForwardArgs& a, const float* k, const float* v, int64_t cols) {
    bf16::pack_column_pairs(k, cols, a.head_dim, a.k.token_stride, keys_, kv_width_);
    bf16::pack_column_pairs(v, cols, a.head_dim, a.v.token_stride, values_, kv_width_);
    bf16::pack_row_pairs(k, cols, a.head_dim, a.k.token_stride, keys_by_rows_, d_width_);
  }
  void query_tile(const loom::AttentionBackwardArgs& args, int64_t b, int64_t g, int64_t h, int64_t qt, const float* q,
                  const float* dout, int64_t count) {
    const loom::AttentionForwardArgs& a = *args.forward;
    if (b != b_ || g != g_) {
      std::fill(ready_, ready_ + entries_, 0u);
      b_ = b;
      g_ = g;
    }
    const int64_t entry = cache_all_ ? (h - g * group_) * q_tiles_ + qt : 0;
    q_rows_ = cache_ + entry * 2 * (rows_words_ + pairs_words_);
    dout_rows_ = q_rows_ + rows_words_;
    q_pairs_at_ = dout_rows_ + rows_words_;
    dout_pairs_ = q_pairs_at_ + pairs_words_;
    if (cache_all_ && ready_[entry] != 0) return;
    const int64_t out_ld = a.q_heads * a.head_dim;
    bf16::pack_rows(q, count, a.head_dim, a.q.token_stride, q_rows_, d_pairs_);
    bf16::pack_row_pairs(dout, count, a.head_dim, out_ld, dout_pairs_, d_width_);
    if (args.dq.data != nullptr || args.dk.data != nullptr)
      bf16::pack_rows(dout, count, a.head_dim, out_ld, dout_rows_, d_pairs_);
    if (args.dk.data != nullptr) bf16::pack_row_pairs(q, count, a.head_dim, a.q.token_stride, q_pairs_at_, d_width_);
    ready_[entry] = 1;
  }
  void scores(const loom::AttentionForwardArgs& a, const float*, int64_t count, int64_t cols) {
    bf16::product(q_rows_, d_pairs_, 1, count, keys_, kv_width_, cols, d_pairs_, a.params.scale, false, capped,
                  block_kv_);
  }
  void add_dv(const loom::AttentionForwardArgs& a, const float*, int64_t, int64_t count, int64_t cols, float* dv,
              int64_t ld) {
    bf16::pack_row_pairs(probs, count, cols, block_kv_, transposed_, kv_width_);
    bf16::product(transposed_, 1, kv_width_, cols, dout_pairs_, d_width_, a.head_dim, bf16::pairs_of(count), 1.0f, true,
                  dv, ld);
  }
  void dp(const loom::AttentionForwardArgs&, const float*, int64_t, int64_t count, int64_t cols) {
    bf16::product(dout_rows_, d_pairs_, 1, count, values_, kv_width_, cols, d_pairs_, 1.0f, false, grads, block_kv_);
  }
  void add_dq(const loom::AttentionForwardArgs& a, const float*, int64_t count, int64_t cols, float* dq, int64_t ld) {
    bf16::pack_rows(grads, count, cols, block_kv_, ds_rows_, kv_pairs_);
    bf16::product(ds_rows_, kv_pairs_, 1, count, keys_by_rows_, d_width_, a.head_dim, bf16::pairs_of(cols),
                  a.params.scale, true, dq, ld);
  }
  void add_dk(const loom::AttentionForwardArgs& a, const float*, int64_t count, int64_t cols, float* dk, int64_t ld) {
    bf16::pack_row_pairs(grads, count, cols, block_kv_, transposed_, kv_width_);
    bf16::product(transposed_, 1, kv_width_, cols, q_pairs_at_, d_width_, a.head_dim, bf16::pairs_of(count),
                  a.params.scale, true, dk, ld);
  }

  float *capped, *probs, *grads;

 private:
  int64_t block_kv_, d_pairs_, kv_pairs_, q_pairs_, kv_width_, d_width_, rows_words_, pairs_words_, q_tiles_, group_;
  bool cache_all_ = true;
  int64_t entries_ = 0;
  loom::Tensor floats_, words_;
  uint32_t *keys_, *values_, *keys_by_rows_, *transposed_, *ds_rows_, *cache_, *ready_;
  uint32_t *q_rows_ = nullptr, *dout_rows_ = nullptr, *q_pairs_at_ = nullptr, *dout_pairs_ = nullptr;
  int64_t b_ = -1, g_ = -1;
};

// ---------------------------------------------------------------------------------------------

class FlashAttention final : public loom::AttentionKernel {
 public:
  FlashAttention(loom::ExecutionContext& execution, int64_t block_q, int64_t block_kv, int64_t bf16_cache_mib)
      : execution_(execution),
        block_q_(block_q),
        block_kv_(block_kv),
        bf16_cache_bytes_(bf16_cache_mib << 20),
        has_bf16_(bf16::cpu_supported()) {}

  void forward(const loom::AttentionForwardArgs& a) override {
    if (a.batch == 0 || a.q_heads == 0 || a.q_len == 0) return;
    if (a.compute == loom::DType::bf16 && has_bf16_)
      forward_with<Bf16ForwardTiles>(a);
    else
      forward_with<F32ForwardTiles>(a);
  }

  void backward(const loom::AttentionBackwardArgs& args) override {
    if (args.forward->compute == loom::DType::bf16 && has_bf16_)
      backward_with<Bf16BackwardTiles>(args);
    else
      backward_with<F32BackwardTiles>(args);
  }

 private:
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

  template <class Tiles>
  void forward_with(const loom::AttentionForwardArgs& a) {
    const int64_t q_tiles = (a.q_len + block_q_ - 1) / block_q_;
    const int64_t items = a.batch * a.q_heads * q_tiles;
    execution_.parallel_for(items, 1, [&](int64_t begin, int64_t end) {
      Tiles tiles(a, block_q_, block_kv_);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t bh = item / q_tiles;
        forward_tile(a, bh / a.q_heads, bh % a.q_heads, balanced_tile(item % q_tiles, q_tiles), tiles);
      }
    });
  }

  template <class Tiles>
  void backward_with(const loom::AttentionBackwardArgs& args) {
    const loom::AttentionForwardArgs& a = *args.forward;
    const bool want_dq = args.dq.data != nullptr, want_dk = args.dk.data != nullptr, want_dv = args.dv.data != nullptr;
    if (a.batch == 0 || a.kv_heads == 0 || (!want_dq && !want_dk && !want_dv)) return;
    const int64_t d = a.head_dim, group = a.q_heads / a.kv_heads, out_ld = a.q_heads * d;
    const int64_t q_tiles = (a.q_len + block_q_ - 1) / block_q_, kv_tiles = (a.kv_len + block_kv_ - 1) / block_kv_;

    // D_i = rowsum(dO_i * O_i), [batch, q_heads, q_len] (with dO as the products see it).
    loom::Tensor delta_buffer = loom::Tensor::empty(loom::Shape{a.batch, a.q_heads, a.q_len});
    float* delta = delta_buffer.data<float>();
    execution_.parallel_for(a.batch * a.q_heads, 1, [&](int64_t begin, int64_t end) {
      for (int64_t bh = begin; bh < end; ++bh) {
        const int64_t b = bh / a.q_heads, h = bh % a.q_heads;
        for (int64_t i = 0; i < a.q_len; ++i) {
          const int64_t row = (b * a.q_len + i) * out_ld + h * d;
          delta[bh * a.q_len + i] = Tiles::delta(args.dout + row, a.out + row, d);
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
      Tiles tiles(args, block_q_, block_kv_, bf16_cache_bytes_);
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

  template <class Tiles>
  void forward_tile(const loom::AttentionForwardArgs& a, int64_t b, int64_t h, int64_t qt, Tiles& tiles) const {
    const loom::AttentionMask mask(a);
    const int64_t d = a.head_dim, g = h / (a.q_heads / a.kv_heads);
    const int64_t i0 = qt * block_q_, count = std::min(block_q_, a.q_len - i0);
    const float* q = a.q.data + b * a.q.batch_stride + i0 * a.q.token_stride + h * d;
    const int64_t out_ld = a.q_heads * d;
    float* out = a.out + (b * a.q_len + i0) * out_ld + h * d;
    float* lse = a.lse + (b * a.q_heads + h) * a.q_len + i0;
    float *scores = tiles.scores, *max = tiles.max, *sum = tiles.sum;
    zero_rows(out, count, d, out_ld);
    std::fill(max, max + count, negative_infinity);
    std::fill(sum, sum + count, 0.0f);
    tiles.begin(a, b, g, q, count);

    const int64_t kv_tiles = (a.kv_len + block_kv_ - 1) / block_kv_;
    for (int64_t kt = 0; kt < kv_tiles; ++kt) {
      const int64_t j0 = kt * block_kv_, cols = std::min(block_kv_, a.kv_len - j0);
      const loom::MaskCover cover = mask.cover(b, i0, i0 + count, j0, j0 + cols);
      if (cover == loom::MaskCover::none) continue;
      const float* k = a.k.data + b * a.k.batch_stride + j0 * a.k.token_stride + g * d;
      const float* v = a.v.data + b * a.v.batch_stride + j0 * a.v.token_stride + g * d;
      tiles.scores_tile(a, q, count, k, kt, cols);  // S = scale Q K^T
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
      tiles.add_pv(a, count, v, kt, cols, out, out_ld);  // out += P V
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
  template <class Tiles>
  void backward_key_tile(const loom::AttentionBackwardArgs& args, int64_t b, int64_t g, int64_t kt, int64_t q_tiles,
                         const float* delta, const DqTarget& dq, Tiles& tiles) const {
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
    tiles.key_tile(a, k, v, cols);

    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
      const float* lse = a.lse + (b * a.q_heads + h) * a.q_len;
      const float* row_delta = delta + (b * a.q_heads + h) * a.q_len;
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        const int64_t i0 = qt * block_q_, count = std::min(block_q_, a.q_len - i0);
        const loom::MaskCover cover = mask.cover(b, i0, i0 + count, j0, j0 + cols);
        if (cover == loom::MaskCover::none) continue;
        const float* q = a.q.data + b * a.q.batch_stride + i0 * a.q.token_stride + h * d;
        const float* dout = args.dout + (b * a.q_len + i0) * out_ld + h * d;
        tiles.query_tile(args, b, g, h, qt, q, dout, count);
        tiles.scores(a, q, count, cols);  // S = scale Q K^T
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
        if (dv) tiles.add_dv(a, dout, out_ld, count, cols, dv, args.dv.token_stride);  // dV += P^T dO
        if (!dk && !dq.data) continue;
        // dP = dO V^T, then dS = P (dP - D) (times the cap's derivative)
        tiles.dp(a, dout, out_ld, count, cols);
        for (int64_t r = 0; r < count; ++r)
          rows::softmax_grad_row(tiles.grads + r * block_kv_, tiles.probs + r * block_kv_, tiles.capped + r * block_kv_,
                                 cols, row_delta[i0 + r], cap);
        if (dq.data) {  // dQ += scale dS K
          float* target = dq.data + (dq.head_stride == 0 ? h * d : h * dq.head_stride) + i0 * dq.token_stride;
          tiles.add_dq(a, k, count, cols, target, dq.token_stride);
        }
        if (dk) tiles.add_dk(a, q, count, cols, dk, args.dk.token_stride);  // dK += scale dS^T Q
      }
    }
  }

  loom::ExecutionContext& execution_;
  int64_t block_q_, block_kv_, bf16_cache_bytes_;
  bool has_bf16_;  // the CPU has AVX512-BF16 (+BW, VL): compute == bf16 takes the bf16 products
};

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("block_q", 64, "Query rows per tile (the score tile is block_q x block_kv floats).").range(4, 1024);
  s.integer("block_kv", 64, "Keys per tile.").range(4, 1024);
  s.integer("bf16_cache_mib", 16,
            "With bf16 tile products: how much memory (MiB per thread) the backward pass may keep bf16 copies "
            "of the query and output-gradient tiles of a (batch, kv head) in, to round each once; beyond it, "
            "they are rounded at each use.")
      .range(0, 65536);
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::AttentionKernel>(
      {.name = "flash",
       .description = "tiled attention with an online softmax and a recomputing backward (FlashAttention-2)",
       .version = "1.0.0",
       .options = options(),
       .preference = 100},  // the fast host kernel: what `model.attention: auto` picks on the host
      [](const loom::Options& o, const loom::CreateContext& context) {
        return std::make_unique<FlashAttention>(context.execution(), o.get<std::int64_t>("block_q"),
                                                o.get<std::int64_t>("block_kv"), o.get<std::int64_t>("bf16_cache_mib"));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
