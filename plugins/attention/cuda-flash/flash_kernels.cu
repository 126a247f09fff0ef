// attention/cuda-flash: FlashAttention-2 (Dao 2023) on an NVIDIA GPU, sm_80 and newer.
//
// Forward: one block per (query tile, head, batch). The query tile stays in shared memory; the
// key/value tiles stream past it; each score tile S = scale Q K_j^T is soft-capped, masked and
// exponentiated in shared memory (one warp per row: the row maximum and sum are warp reductions),
// the running maximum and sum are rescaled as the maximum grows (the online softmax), and the
// output accumulator O (float32, shared) takes P V_j. The log-sum-exp m + log l is saved for the
// backward pass. Tiles hidden by the causal mask or the window are skipped.
//
// Backward, by recomputation (FlashAttention-2's algorithm 2), deterministic: no atomics.
//   1. delta_i = rowsum(dO_i * O_i), one warp per row.
//   2. dK/dV: one block per (key tile, kv head, batch) visits every query tile of every head of
//      its group in a fixed order: S and dP = dO V^T, then P = exp(S - lse) and
//      dS = P (dP - delta) (times the soft-cap's derivative), then dV += P^T dO and
//      dK += scale dS^T Q, accumulated in shared memory and written once.
//   3. dQ: one block per (query tile, head, batch) visits the key tiles in order, recomputing S,
//      dP and dS, and accumulates dQ += scale dS K_j in shared memory.
// The dQ kernel recomputes what the dK/dV kernel computed (two more tile products per tile pair)
// instead of FlashAttention-2's atomic adds into dQ, whose order, and so whose bits, would change
// from run to run; the contract asks for bit-identical reruns.
//
// Tile products run on shared memory: with bf16 operands (Problem::bf16: Q, K, V, P, dO and dS
// rounded to bfloat16, nearest even, as they are stored for a product) on the tensor cores through
// WMMA (16 x 16 x 16 fragments, float32 accumulation); with float32 operands as plain FMA loops,
// one output element per thread and step, so that float32 stays float32 (no TF32). Everything else
// (statistics, the log-sum-exp, O, delta, the gradients) is float32 in both.
//
// The per-element arithmetic (mask, soft-cap and its derivative, the online softmax's rescale,
// the recomputed probability, the score gradient, bf16 rounding) is flash_math.hpp's, shared with
// the host tests. Head dims are padded with zeros to 64, 128 or 256 (three instantiations per
// kernel and dtype); tile edges by padded head dim (flash_math.hpp), shared memory per block
// (bytes, 4 warps):
//   forward   bf16 64: 64x64 tiles, 71 KiB;  128: 64x64, 111 KiB;  256: 32x32, 89 KiB
//             f32  64: 64x64, 86 KiB;  128: 64x64, 150 KiB;  256: 32x32, 135 KiB
//   backward  bf16 64: 64x64, 123 KiB;  128: 32x32, 81 KiB;  256: 32x32, 145 KiB (dK/dV; dQ less)
//             f32  64: 64x64, 154 KiB;  128: 32x32, 113 KiB;  256: 16x16, 102 KiB
// (shared_bytes_needed computes them; an A100 allows 163 KiB per block, an H100/H200 227 KiB).
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>
#include <loom/error.hpp>
#include <string>
#include <type_traits>

#include "flash_launch.hpp"
#include "flash_math.hpp"

namespace loom::cuda_flash {

namespace {

using namespace nvcuda;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;

void check(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw InternalError(std::string("attention cuda-flash: ") + what + " failed: " + cudaGetErrorName(error) + " (" +
                        cudaGetErrorString(error) + ")");
}

// After a launch: the launch's own error (configuration, no kernel image for this GPU).
void check_launch(const char* kernel) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    throw InternalError(std::string("attention cuda-flash: kernel ") + kernel +
                        " failed to launch: " + cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ")");
#ifdef LOOM_CUDA_SYNC_CHECKS
  check(cudaDeviceSynchronize(), kernel);
#endif
}

// ---- Operands in shared memory: bf16 or float, rows padded (bank conflicts, WMMA's ldm).

template <class T>
constexpr int row_pad = std::is_same_v<T, float> ? 4 : 8;

template <class T>
__device__ inline T operand(float x);
template <>
__device__ inline float operand<float>(float x) {
  return x;
}
template <>
__device__ inline __nv_bfloat16 operand<__nv_bfloat16>(float x) {
  __nv_bfloat16_raw raw;
  raw.x = bf16_bits(x);
  return __nv_bfloat16(raw);
}

// C (M x N, float, row stride ldc) = alpha op(A) op(B) (+ C when accumulate), all in shared
// memory, by the whole block (callers synchronise around it). op(A) is M x K: A row-major, or
// with AT the transpose of a row-major K x M; op(B) is K x N: B row-major, or with BT the
// transpose of a row-major N x K.
template <bool AT, bool BT, int M, int N, int K>
__device__ void product(const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb, float* C, int ldc,
                        float alpha, bool accumulate) {
  using LayoutA = std::conditional_t<AT, wmma::col_major, wmma::row_major>;
  using LayoutB = std::conditional_t<BT, wmma::col_major, wmma::row_major>;
  constexpr int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
  const int warp = static_cast<int>(threadIdx.x) / 32;
  for (int t = warp; t < tiles; t += kWarps) {
    const int tm = t / tiles_n, tn = t % tiles_n;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll 4
    for (int k0 = 0; k0 < K; k0 += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB> b;
      wmma::load_matrix_sync(a, AT ? A + k0 * lda + tm * 16 : A + tm * 16 * lda + k0, lda);
      wmma::load_matrix_sync(b, BT ? B + tn * 16 * ldb + k0 : B + k0 * ldb + tn * 16, ldb);
      wmma::mma_sync(acc, a, b, acc);
    }
    float* c = C + tm * 16 * ldc + tn * 16;
    if (accumulate) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> prior;
      wmma::load_matrix_sync(prior, c, ldc, wmma::mem_row_major);
      for (int i = 0; i < acc.num_elements; ++i) acc.x[i] = prior.x[i] + alpha * acc.x[i];
    } else {
      for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= alpha;
    }
    wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
  }
}

// The float32 product: one output element per thread and step, summed over k in order.
template <bool AT, bool BT, int M, int N, int K>
__device__ void product(const float* A, int lda, const float* B, int ldb, float* C, int ldc, float alpha,
                        bool accumulate) {
  for (int idx = static_cast<int>(threadIdx.x); idx < M * N; idx += kThreads) {
    const int m = idx / N, n = idx % N;
    float s = 0.0f;
#pragma unroll 8
    for (int k = 0; k < K; ++k) s = fmaf(AT ? A[k * lda + m] : A[m * lda + k], BT ? B[n * ldb + k] : B[k * ldb + n], s);
    C[m * ldc + n] = accumulate ? C[m * ldc + n] + alpha * s : alpha * s;
  }
}

__device__ inline float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ inline float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// rows x D tile of a [batch, len, heads, head_dim] operand (token stride ts) into shared memory:
// rows past `count` and elements past head_dim are zeros.
template <class T, int D>
__device__ void load_tile(T* dst, int ld, const float* src, int64_t token_stride, int rows, int count,
                          int64_t head_dim) {
  for (int idx = static_cast<int>(threadIdx.x); idx < rows * D; idx += kThreads) {
    const int r = idx / D, e = idx % D;
    const float x = (r < count && e < head_dim) ? src[r * token_stride + e] : 0.0f;
    dst[r * ld + e] = operand<T>(x);
  }
}

template <class T>
constexpr bool is_bf16 = std::is_same_v<T, __nv_bfloat16>;

// Shared memory carved in 128-byte aligned pieces (WMMA wants 32-byte aligned fragments).
struct Carver {
  char* base;
  int64_t used = 0;
  template <class U>
  __host__ __device__ U* take(int64_t count) {
    U* p = base ? reinterpret_cast<U*>(base + used) : nullptr;
    used += (count * static_cast<int64_t>(sizeof(U)) + 127) / 128 * 128;
    return p;
  }
};

template <class T, int D, int B>
struct ForwardLayout {
  static constexpr int ld = D + row_pad<T>, ld_o = D + 4, ld_s = B + 4, ld_p = B + row_pad<T>;
  T *q, *k, *v, *p;
  float *o, *s, *max, *sum;
  __host__ __device__ static int64_t bytes() {
    Carver c{nullptr};
    ForwardLayout l;
    l.carve(c);
    return c.used;
  }
  __host__ __device__ void carve(Carver& c) {
    q = c.take<T>(B * ld);
    k = c.take<T>(B * ld);
    v = c.take<T>(B * ld);
    o = c.take<float>(B * ld_o);
    s = c.take<float>(B * ld_s);
    // float32: P overwrites S in place.
    if constexpr (is_bf16<T>)
      p = c.take<T>(B * ld_p);
    else
      p = reinterpret_cast<T*>(s);
    max = c.take<float>(B);
    sum = c.take<float>(B);
  }
};

template <class T, int D, int B>
struct BackwardLayout {
  static constexpr int ld = D + row_pad<T>, ld_g = D + 4, ld_s = B + 4;
  static constexpr int ld_p = is_bf16<T> ? B + row_pad<T> : ld_s;
  T *q, *dout, *k, *v, *p, *ds;
  float *acc_a, *acc_b, *s, *dp, *lse, *delta;
  __host__ __device__ static int64_t bytes(bool dkdv) {
    Carver c{nullptr};
    BackwardLayout l;
    l.carve(c, dkdv);
    return c.used;
  }
  // dK/dV: acc_a = dK, acc_b = dV, and P is kept for dV += P^T dO. dQ: acc_a = dQ only.
  __host__ __device__ void carve(Carver& c, bool dkdv) {
    q = c.take<T>(B * ld);
    dout = c.take<T>(B * ld);
    k = c.take<T>(B * ld);
    v = c.take<T>(B * ld);
    acc_a = c.take<float>(B * ld_g);
    acc_b = dkdv ? c.take<float>(B * ld_g) : nullptr;
    s = c.take<float>(B * ld_s);
    dp = c.take<float>(B * ld_s);
    p = dkdv ? c.take<T>(B * ld_p) : nullptr;
    // float32: dS overwrites dP in place.
    if constexpr (is_bf16<T>)
      ds = c.take<T>(B * ld_p);
    else
      ds = reinterpret_cast<T*>(dp);
    lse = c.take<float>(B);
    delta = c.take<float>(B);
  }
};

__host__ __device__ inline MaskRule rule_of(const Problem& p) {
  return MaskRule{p.kv_len - p.q_len, p.window, p.causal};
}

// ---- Forward.

template <class T, int D, int B>
__global__ void __launch_bounds__(kThreads) forward_kernel(Problem p) {
  extern __shared__ __align__(128) char shared[];
  using L = ForwardLayout<T, D, B>;
  L l;
  Carver carver{shared};
  l.carve(carver);
  const MaskRule rule = rule_of(p);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * B;
  const int count = static_cast<int>(p.q_len - i0 < B ? p.q_len - i0 : B);
  const int64_t g = h / (p.q_heads / p.kv_heads);
  const bool segments = p.q_segments != nullptr;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;

  load_tile<T, D>(l.q, L::ld, p.q + b * p.q_batch_stride + i0 * p.q_token_stride + h * p.head_dim, p.q_token_stride, B,
                  count, p.head_dim);
  for (int idx = static_cast<int>(threadIdx.x); idx < B * L::ld_o; idx += kThreads) l.o[idx] = 0.0f;
  for (int r = static_cast<int>(threadIdx.x); r < B; r += kThreads) {
    l.max[r] = minus_infinity();
    l.sum[r] = 0.0f;
  }

  const int64_t kv_tiles = (p.kv_len + B - 1) / B;
  for (int64_t kt = 0; kt < kv_tiles; ++kt) {
    const int64_t j0 = kt * B;
    const int cols = static_cast<int>(p.kv_len - j0 < B ? p.kv_len - j0 : B);
    if (tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
    __syncthreads();  // the previous tile's P V has read K, V and P
    load_tile<T, D>(l.k, L::ld, p.k + b * p.k_batch_stride + j0 * p.k_token_stride + g * p.head_dim, p.k_token_stride,
                    B, cols, p.head_dim);
    load_tile<T, D>(l.v, L::ld, p.v + b * p.v_batch_stride + j0 * p.v_token_stride + g * p.head_dim, p.v_token_stride,
                    B, cols, p.head_dim);
    __syncthreads();
    product<false, true, B, B, D>(l.q, L::ld, l.k, L::ld, l.s, L::ld_s, p.scale, false);  // S = scale Q K^T
    __syncthreads();
    // One warp per row: soft-cap, mask, the online softmax; P into l.p, O's row rescaled.
    for (int r = warp; r < B; r += kWarps) {
      float* row = l.s + r * L::ld_s;
      const std::int32_t q_id = (segments && r < count) ? p.q_segments[b * p.q_len + i0 + r] : 0;
      float tile_max = minus_infinity();
      for (int c = lane; c < B; c += 32) {
        const bool seen =
            r < count && c < cols &&
            visible(rule, i0 + r, j0 + c, segments, q_id, segments ? p.kv_segments[b * p.kv_len + j0 + c] : 0);
        const float s = seen ? softcap(row[c], p.softcap) : minus_infinity();
        row[c] = s;
        tile_max = fmaxf(tile_max, s);
      }
      tile_max = warp_max(tile_max);
      const float old_max = l.max[r];
      const float new_max = online_max(old_max, tile_max);
      const float factor = rescale(old_max, new_max);
      float tile_sum = 0.0f;
      for (int c = lane; c < B; c += 32) {
        const float e = shifted_exp(row[c], new_max);
        tile_sum += e;
        // float32: l.p aliases l.s (same element, same thread).
        l.p[r * L::ld_p + c] = operand<T>(e);
      }
      tile_sum = warp_sum(tile_sum);
      if (factor != 1.0f)
        for (int e = lane; e < D; e += 32) l.o[r * L::ld_o + e] *= factor;
      __syncwarp();
      if (lane == 0) {
        l.sum[r] = l.sum[r] * factor + tile_sum;
        l.max[r] = new_max;
      }
    }
    __syncthreads();
    product<false, false, B, D, B>(l.p, L::ld_p, l.v, L::ld, l.o, L::ld_o, 1.0f, true);  // O += P V
  }
  __syncthreads();
  const int64_t out_ld = p.q_heads * p.head_dim;
  for (int r = warp; r < count; r += kWarps) {
    const RowEnd end = finish_row(l.max[r], l.sum[r]);
    float* out = p.out + (b * p.q_len + i0 + r) * out_ld + h * p.head_dim;
    for (int e = lane; e < p.head_dim; e += 32) out[e] = l.o[r * L::ld_o + e] * end.out_scale;
    if (lane == 0) p.lse[(b * p.q_heads + h) * p.q_len + i0 + r] = end.lse;
  }
}

// ---- Backward.

// delta[b, h, i] = sum_e dO[b, i, h, e] O[b, i, h, e] (dO rounded to bf16 as the products see it).
__global__ void __launch_bounds__(kThreads) delta_kernel(Problem p, const float* dout, float* delta, bool bf16) {
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const int64_t i = row % p.q_len, bh = row / p.q_len, h = bh % p.q_heads, b = bh / p.q_heads;
    const int64_t at = (b * p.q_len + i) * p.q_heads * p.head_dim + h * p.head_dim;
    float s = 0.0f;
    for (int64_t e = lane; e < p.head_dim; e += 32) {
      const float d = bf16 ? bf16_value(dout[at + e]) : dout[at + e];
      s = fmaf(d, p.out[at + e], s);
    }
    s = warp_sum(s);
    if (lane == 0) delta[row] = s;
  }
}

// The part both backward kernels share, for one (query tile, key tile) pair whose operands are in
// shared memory: S = scale Q K^T and dP = dO V^T, then per score the soft-cap, the mask, P and dS.
template <class T, int D, int B>
__device__ void scores_and_gradients(const Problem& p, const BackwardLayout<T, D, B>& l, int64_t b, int64_t i0,
                                     int count, int64_t j0, int cols, bool keep_p) {
  using L = BackwardLayout<T, D, B>;
  const MaskRule rule = rule_of(p);
  const bool segments = p.q_segments != nullptr;
  product<false, true, B, B, D>(l.q, L::ld, l.k, L::ld, l.s, L::ld_s, p.scale, false);   // S = scale Q K^T
  product<false, true, B, B, D>(l.dout, L::ld, l.v, L::ld, l.dp, L::ld_s, 1.0f, false);  // dP = dO V^T
  __syncthreads();
  for (int idx = static_cast<int>(threadIdx.x); idx < B * B; idx += kThreads) {
    const int r = idx / B, c = idx % B;
    const bool seen = r < count && c < cols &&
                      visible(rule, i0 + r, j0 + c, segments, segments ? p.q_segments[b * p.q_len + i0 + r] : 0,
                              segments ? p.kv_segments[b * p.kv_len + j0 + c] : 0);
    const float capped = softcap(l.s[r * L::ld_s + c], p.softcap);
    const float prob = probability(capped, r < count ? l.lse[r] : minus_infinity(), seen);
    const float ds = score_gradient(prob, l.dp[r * L::ld_s + c], r < count ? l.delta[r] : 0.0f, capped, p.softcap);
    if (keep_p) l.p[r * L::ld_p + c] = operand<T>(prob);
    // float32: l.ds aliases l.dp (same element, same thread).
    l.ds[r * L::ld_p + c] = operand<T>(ds);
  }
  __syncthreads();
}

template <class T, int D, int B>
__device__ void load_query_side(const Problem& p, const BackwardProblem& g, const BackwardLayout<T, D, B>& l, int64_t b,
                                int64_t h, int64_t i0, int count) {
  using L = BackwardLayout<T, D, B>;
  load_tile<T, D>(l.q, L::ld, p.q + b * p.q_batch_stride + i0 * p.q_token_stride + h * p.head_dim, p.q_token_stride, B,
                  count, p.head_dim);
  const int64_t out_ld = p.q_heads * p.head_dim;
  load_tile<T, D>(l.dout, L::ld, g.dout + (b * p.q_len + i0) * out_ld + h * p.head_dim, out_ld, B, count, p.head_dim);
  for (int r = static_cast<int>(threadIdx.x); r < B; r += kThreads) {
    l.lse[r] = r < count ? p.lse[(b * p.q_heads + h) * p.q_len + i0 + r] : minus_infinity();
    l.delta[r] = r < count ? g.delta[(b * p.q_heads + h) * p.q_len + i0 + r] : 0.0f;
  }
}

template <class T, int D, int B>
__device__ void load_key_side(const Problem& p, const BackwardLayout<T, D, B>& l, int64_t b, int64_t g, int64_t j0,
                              int cols) {
  using L = BackwardLayout<T, D, B>;
  load_tile<T, D>(l.k, L::ld, p.k + b * p.k_batch_stride + j0 * p.k_token_stride + g * p.head_dim, p.k_token_stride, B,
                  cols, p.head_dim);
  load_tile<T, D>(l.v, L::ld, p.v + b * p.v_batch_stride + j0 * p.v_token_stride + g * p.head_dim, p.v_token_stride, B,
                  cols, p.head_dim);
}

// Writes rows [0, count) of a float accumulator (ld) into a gradient at `dst` (token stride ts).
template <int D>
__device__ void store_gradient(const float* acc, int ld, const Gradient& grad, float* dst, int count,
                               int64_t head_dim) {
  for (int idx = static_cast<int>(threadIdx.x); idx < count * D; idx += kThreads) {
    const int r = idx / D, e = idx % D;
    if (e >= head_dim) continue;
    float* at = dst + r * grad.token_stride + e;
    *at = grad.accumulate ? *at + acc[r * ld + e] : acc[r * ld + e];
  }
}

template <class T, int D, int B>
__global__ void __launch_bounds__(kThreads) dkdv_kernel(Problem p, BackwardProblem g) {
  extern __shared__ __align__(128) char shared[];
  using L = BackwardLayout<T, D, B>;
  L l;
  Carver carver{shared};
  l.carve(carver, true);
  const MaskRule rule = rule_of(p);
  const int64_t b = blockIdx.z, kv_head = blockIdx.y, j0 = static_cast<int64_t>(blockIdx.x) * B;
  const int cols = static_cast<int>(p.kv_len - j0 < B ? p.kv_len - j0 : B);
  const int64_t group = p.q_heads / p.kv_heads;

  load_key_side<T, D, B>(p, l, b, kv_head, j0, cols);
  for (int idx = static_cast<int>(threadIdx.x); idx < B * L::ld_g; idx += kThreads) l.acc_a[idx] = l.acc_b[idx] = 0.0f;

  const int64_t q_tiles = (p.q_len + B - 1) / B;
  for (int64_t h = kv_head * group; h < (kv_head + 1) * group; ++h)
    for (int64_t qt = 0; qt < q_tiles; ++qt) {
      const int64_t i0 = qt * B;
      const int count = static_cast<int>(p.q_len - i0 < B ? p.q_len - i0 : B);
      if (tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
      __syncthreads();  // the previous pair's products have read Q, dO, P and dS
      load_query_side<T, D, B>(p, g, l, b, h, i0, count);
      __syncthreads();
      scores_and_gradients<T, D, B>(p, l, b, i0, count, j0, cols, true);
      product<true, false, B, D, B>(l.p, L::ld_p, l.dout, L::ld, l.acc_b, L::ld_g, 1.0f, true);   // dV += P^T dO
      product<true, false, B, D, B>(l.ds, L::ld_p, l.q, L::ld, l.acc_a, L::ld_g, p.scale, true);  // dK += s dS^T Q
    }
  __syncthreads();
  if (g.dk.data)
    store_gradient<D>(l.acc_a, L::ld_g, g.dk,
                      g.dk.data + b * g.dk.batch_stride + j0 * g.dk.token_stride + kv_head * p.head_dim, cols,
                      p.head_dim);
  if (g.dv.data)
    store_gradient<D>(l.acc_b, L::ld_g, g.dv,
                      g.dv.data + b * g.dv.batch_stride + j0 * g.dv.token_stride + kv_head * p.head_dim, cols,
                      p.head_dim);
}

template <class T, int D, int B>
__global__ void __launch_bounds__(kThreads) dq_kernel(Problem p, BackwardProblem g) {
  extern __shared__ __align__(128) char shared[];
  using L = BackwardLayout<T, D, B>;
  L l;
  Carver carver{shared};
  l.carve(carver, false);
  const MaskRule rule = rule_of(p);
  const int64_t b = blockIdx.z, h = blockIdx.y, i0 = static_cast<int64_t>(blockIdx.x) * B;
  const int count = static_cast<int>(p.q_len - i0 < B ? p.q_len - i0 : B);
  const int64_t kv_head = h / (p.q_heads / p.kv_heads);

  load_query_side<T, D, B>(p, g, l, b, h, i0, count);
  for (int idx = static_cast<int>(threadIdx.x); idx < B * L::ld_g; idx += kThreads) l.acc_a[idx] = 0.0f;

  const int64_t kv_tiles = (p.kv_len + B - 1) / B;
  for (int64_t kt = 0; kt < kv_tiles; ++kt) {
    const int64_t j0 = kt * B;
    const int cols = static_cast<int>(p.kv_len - j0 < B ? p.kv_len - j0 : B);
    if (tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
    __syncthreads();  // the previous tile's dQ product has read K and dS
    load_key_side<T, D, B>(p, l, b, kv_head, j0, cols);
    __syncthreads();
    scores_and_gradients<T, D, B>(p, l, b, i0, count, j0, cols, false);
    product<false, false, B, D, B>(l.ds, L::ld_p, l.k, L::ld, l.acc_a, L::ld_g, p.scale, true);  // dQ += s dS K
  }
  __syncthreads();
  store_gradient<D>(l.acc_a, L::ld_g, g.dq, g.dq.data + b * g.dq.batch_stride + i0 * g.dq.token_stride + h * p.head_dim,
                    count, p.head_dim);
}

// ---- Dispatch: dtype and padded head dim to one instantiation.

template <class T, int D>
struct Kernels {
  static constexpr int forward_b = static_cast<int>(forward_tile(D, is_bf16<T>));
  static constexpr int backward_b = static_cast<int>(backward_tile(D, is_bf16<T>));
  static int64_t forward_bytes() { return ForwardLayout<T, D, forward_b>::bytes(); }
  static int64_t dkdv_bytes() { return BackwardLayout<T, D, backward_b>::bytes(true); }
  static int64_t dq_bytes() { return BackwardLayout<T, D, backward_b>::bytes(false); }

  static void prepare() {
    check(cudaFuncSetAttribute(forward_kernel<T, D, forward_b>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(forward_bytes())),
          "cudaFuncSetAttribute (forward)");
    check(cudaFuncSetAttribute(dkdv_kernel<T, D, backward_b>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(dkdv_bytes())),
          "cudaFuncSetAttribute (dK/dV)");
    check(cudaFuncSetAttribute(dq_kernel<T, D, backward_b>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(dq_bytes())),
          "cudaFuncSetAttribute (dQ)");
  }

  static void forward(cudaStream_t stream, const Problem& p) {
    const dim3 grid(static_cast<unsigned>((p.q_len + forward_b - 1) / forward_b), static_cast<unsigned>(p.q_heads),
                    static_cast<unsigned>(p.batch));
    forward_kernel<T, D, forward_b><<<grid, kThreads, forward_bytes(), stream>>>(p);
    check_launch("forward");
  }

  static void backward(cudaStream_t stream, const Problem& p, const BackwardProblem& g) {
    if ((g.dk.data || g.dv.data) && p.kv_len > 0) {
      const dim3 grid(static_cast<unsigned>((p.kv_len + backward_b - 1) / backward_b),
                      static_cast<unsigned>(p.kv_heads), static_cast<unsigned>(p.batch));
      dkdv_kernel<T, D, backward_b><<<grid, kThreads, dkdv_bytes(), stream>>>(p, g);
      check_launch("dK/dV");
    }
    if (g.dq.data && p.q_len > 0) {
      const dim3 grid(static_cast<unsigned>((p.q_len + backward_b - 1) / backward_b), static_cast<unsigned>(p.q_heads),
                      static_cast<unsigned>(p.batch));
      dq_kernel<T, D, backward_b><<<grid, kThreads, dq_bytes(), stream>>>(p, g);
      check_launch("dQ");
    }
  }
};

template <class F>
void dispatch(const Problem& p, F&& f) {
  const int64_t d = padded_head_dim(p.head_dim);
  if (p.bf16) {
    if (d == 64) return f(Kernels<__nv_bfloat16, 64>{});
    if (d == 128) return f(Kernels<__nv_bfloat16, 128>{});
    if (d == 256) return f(Kernels<__nv_bfloat16, 256>{});
  } else {
    if (d == 64) return f(Kernels<float, 64>{});
    if (d == 128) return f(Kernels<float, 128>{});
    if (d == 256) return f(Kernels<float, 256>{});
  }
  throw InternalError("attention cuda-flash: head_dim " + std::to_string(p.head_dim) + " reached the kernels");
}

}  // namespace

int64_t shared_bytes_needed(int64_t head_dim, bool bf16) {
  Problem p;
  p.head_dim = head_dim;
  p.bf16 = bf16;
  int64_t most = 0;
  dispatch(p, [&](auto k) {
    using K = decltype(k);
    most = std::max({K::forward_bytes(), K::dkdv_bytes(), K::dq_bytes()});
  });
  return most;
}

void prepare_kernels() {
  Kernels<__nv_bfloat16, 64>::prepare();
  Kernels<__nv_bfloat16, 128>::prepare();
  Kernels<__nv_bfloat16, 256>::prepare();
  Kernels<float, 64>::prepare();
  Kernels<float, 128>::prepare();
  Kernels<float, 256>::prepare();
}

void launch_forward(cudaStream_t stream, const Problem& p) {
  if (p.batch == 0 || p.q_heads == 0 || p.q_len == 0) return;
  dispatch(p, [&](auto k) { decltype(k)::forward(stream, p); });
}

void launch_backward(cudaStream_t stream, const Problem& p, const BackwardProblem& g) {
  if (p.batch == 0 || p.kv_heads == 0 || (!g.dq.data && !g.dk.data && !g.dv.data)) return;
  const int64_t rows = p.batch * p.q_heads * p.q_len;
  if (rows > 0) {
    const int64_t blocks = (rows + kWarps - 1) / kWarps;
    delta_kernel<<<static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16), kThreads, 0, stream>>>(
        p, g.dout, g.delta, p.bf16);
    check_launch("delta");
  }
  dispatch(p, [&](auto k) { decltype(k)::backward(stream, p, g); });
}

}  // namespace loom::cuda_flash
