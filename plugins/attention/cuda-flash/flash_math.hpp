// attention/cuda-flash: the per-element arithmetic of the GPU kernels, as LOOM_HOST_DEVICE inline
// functions. flash_kernels.cu calls them per score, per row and per operand element;
// tests/cuda/flash_math_test.cpp compiles this header with g++ and runs the kernels' tile
// algorithm on the host with them (the same tiles, the same online softmax, the same recomputing
// backward) against the `naive` kernel. One source for both, so that what the host tests is what
// the GPU computes, up to the GPU's own expf/tanhf/logf (a few ulp) and its summation order.
//
// The rule is kinds/attention.hpp's (and loom::AttentionMask's, which device code cannot call):
// query row i sits at position p_i = offset + i with offset = kv_len - q_len, and sees key j when
//   causal:          j <= p_i
//   window > 0:      p_i - j < window            (and j - p_i < window if not causal)
//   segments given:  q_segments[b, i] == kv_segments[b, j]
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <loom/host_device.hpp>

namespace loom::cuda_flash {

using std::int64_t;

// The mask of one call, by position (segment ids are compared per score).
struct MaskRule {
  int64_t offset = 0;  // kv_len - q_len
  int64_t window = 0;  // 0: unlimited
  bool causal = true;
};

LOOM_HOST_DEVICE inline float minus_infinity() {
  return -INFINITY;
}

// Whether query row i may see key j by position.
LOOM_HOST_DEVICE inline bool visible_by_position(const MaskRule& m, int64_t i, int64_t j) {
  const int64_t position = m.offset + i;
  if (m.causal && j > position) return false;
  if (m.window > 0) {
    if (position - j >= m.window) return false;
    if (!m.causal && j - position >= m.window) return false;
  }
  return true;
}

// Whether query row i sees key j: by position, and (has_segments) when the ids match.
LOOM_HOST_DEVICE inline bool visible(const MaskRule& m, int64_t i, int64_t j, bool has_segments, std::int32_t q_id,
                                     std::int32_t k_id) {
  return visible_by_position(m, i, j) && (!has_segments || q_id == k_id);
}

// Whether rows [i0, i1) see none of the keys [j0, j1) by position (both ranges non-empty): the
// tile is skipped. AttentionMask::cover's `none` without the segment ids (a tile that only the ids
// hide is computed and masked per score: exact, only slower).
LOOM_HOST_DEVICE inline bool tile_hidden(const MaskRule& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t first = m.offset + i0, last = m.offset + i1 - 1;
  if (m.causal && j0 > last) return true;
  if (m.window > 0) {
    if (j1 - 1 <= first - m.window) return true;
    if (!m.causal && j0 >= last + m.window) return true;
  }
  return false;
}

// Gemma 2's logit soft-cap: cap * tanh(s / cap) when cap > 0.
LOOM_HOST_DEVICE inline float softcap(float s, float cap) {
  return cap > 0.0f ? cap * tanhf(s / cap) : s;
}

// d(cap tanh(s / cap)) / ds in terms of the capped score: 1 - (capped / cap)^2; 1 without a cap.
LOOM_HOST_DEVICE inline float softcap_derivative(float capped, float cap) {
  if (!(cap > 0.0f)) return 1.0f;
  const float t = capped / cap;
  return 1.0f - t * t;
}

// The online softmax. A row keeps its running maximum m (-inf while it has seen no visible key)
// and sum l of exp(s - m); a new tile with maximum t (-inf when it shows the row nothing) moves
// the maximum to max(m, t), multiplies l and the row's output accumulator by
// rescale(m, max(m, t)), and adds exp(s - new maximum) of its scores.
LOOM_HOST_DEVICE inline float online_max(float running, float tile_max) {
  return fmaxf(running, tile_max);
}
LOOM_HOST_DEVICE inline float rescale(float old_max, float new_max) {
  return old_max == -INFINITY ? 0.0f : expf(old_max - new_max);
}
// exp(s - max): 0 for a hidden score (s = -inf) and while nothing is visible (max = -inf).
LOOM_HOST_DEVICE inline float shifted_exp(float s, float max) {
  return (s == -INFINITY || max == -INFINITY) ? 0.0f : expf(s - max);
}

// The end of a row: out = accumulator * out_scale, and the log-sum-exp. A row that saw no key
// gets out = 0 and lse = -inf.
struct RowEnd {
  float out_scale;
  float lse;
};
LOOM_HOST_DEVICE inline RowEnd finish_row(float max, float sum) {
  if (sum == 0.0f) return {0.0f, -INFINITY};
  return {1.0f / sum, max + logf(sum)};
}

// The backward pass's probability, recomputed from the saved log-sum-exp: exp(capped - lse), 0
// for a hidden score or a row that sees no key (lse = -inf).
LOOM_HOST_DEVICE inline float probability(float capped, float lse, bool visible_score) {
  return (visible_score && lse != -INFINITY) ? expf(capped - lse) : 0.0f;
}

// The score gradient: dS = P (dP - D), times the soft-cap's derivative (D = rowsum(dO * O)).
LOOM_HOST_DEVICE inline float score_gradient(float p, float dp, float delta, float capped, float cap) {
  return p * (dp - delta) * softcap_derivative(capped, cap);
}

// bfloat16 rounding (nearest, ties to even; NaN stays NaN), as loom::to_bfloat16: the bits of
// the bf16 operand a tile product reads, and its value as a float.
LOOM_HOST_DEVICE inline std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}
LOOM_HOST_DEVICE inline float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}
LOOM_HOST_DEVICE inline std::uint16_t bf16_bits(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}
LOOM_HOST_DEVICE inline float bf16_value(float f) {
  return bits_float(static_cast<std::uint32_t>(bf16_bits(f)) << 16);
}

// The head dims the kernels are built for: head_dim is padded with zeros to the next one (1 to
// 64 -> 64, 65 to 128 -> 128, 129 to 256 -> 256); larger ones are refused.
inline constexpr int64_t max_head_dim = 256;
LOOM_HOST_DEVICE constexpr int64_t padded_head_dim(int64_t head_dim) {
  return head_dim <= 64 ? 64 : head_dim <= 128 ? 128 : head_dim <= 256 ? 256 : 0;
}

// Tile edge (rows = keys per tile) of each kernel, by padded head dim and operand dtype: as large
// as keeps a block's shared memory within an A100's 163 KiB (flash_kernels.cu lists the bytes).
LOOM_HOST_DEVICE constexpr int64_t forward_tile(int64_t padded_dim, bool) {
  return padded_dim <= 128 ? 64 : 32;
}
LOOM_HOST_DEVICE constexpr int64_t backward_tile(int64_t padded_dim, bool bf16) {
  return padded_dim <= 64 ? 64 : padded_dim <= 128 ? 32 : bf16 ? 32 : 16;
}

}  // namespace loom::cuda_flash
