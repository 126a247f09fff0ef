// A 16-float vector type (GCC vector extensions) and the few functions the cpu kernels need.
//
// In a build for AVX-512 each operation is one zmm instruction; in loom's default x86-64-v3 build
// the compiler splits it into two AVX2 ones (which multiply-adds it fuses may differ, so results
// may differ in the last bits). Tails shorter than a vector go through the same vector code on a
// zero-padded copy: every element is computed by the same instructions wherever it sits, which
// keeps results independent of how a loop is chunked.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

namespace loom::cpu {

inline constexpr int lanes = 16;
using vf = float __attribute__((vector_size(64)));
using vi = std::int32_t __attribute__((vector_size(64)));
using vu = std::uint32_t __attribute__((vector_size(64)));

inline vf splat(float x) {
  return vf{} + x;
}
inline vi splat_i(std::int32_t x) {
  return vi{} + x;
}
inline vu splat_u(std::uint32_t x) {
  return vu{} + x;
}

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) {
  std::memcpy(p, &v, sizeof v);
}

// The first n (<= lanes) elements; the rest of the vector is `pad`.
inline vf load_n(const float* p, std::int64_t n, float pad = 0.0f) {
  if (n == lanes) return load(p);
  vf v = splat(pad);
  std::memcpy(&v, p, static_cast<std::size_t>(n) * sizeof(float));
  return v;
}
inline void store_n(float* p, vf v, std::int64_t n) {
  if (n == lanes)
    store(p, v);
  else
    std::memcpy(p, &v, static_cast<std::size_t>(n) * sizeof(float));
}

inline vf vmax(vf a, vf b) {
  return a > b ? a : b;
}
inline vf vmin(vf a, vf b) {
  return a < b ? a : b;
}

// Lane sums and maxima in a fixed (tree) order.
inline float hsum(vf v) {
  float a[lanes];
  std::memcpy(a, &v, sizeof a);
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
}
inline float hmax(vf v) {
  float a[lanes];
  std::memcpy(a, &v, sizeof a);
  for (int w = lanes / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] = std::max(a[i], a[i + w]);
  return a[0];
}

// e^x to about 2 ulp (Cephes expf: range reduction by ln 2, degree-6 polynomial). Inputs are
// clamped to [-87.3, 88]: the result never overflows, and underflows to ~1e-38 instead of 0.
inline vf exp(vf x) {
  x = vmin(vmax(x, splat(-87.33654f)), splat(88.0f));
  const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const vf t = x * splat(1.44269504088896341f) + magic;
  const vf n = t - magic;
  const vi ni = std::bit_cast<vi>(t) - splat_i(0x4B400000);
  const vf r = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  vf p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  const vf y = p * r * r + r + splat(1.0f);
  return y * std::bit_cast<vf>((ni + splat_i(127)) << 23);
}

inline vf sigmoid(vf x) {
  return splat(1.0f) / (splat(1.0f) + exp(-x));
}

// GELU, tanh form, written as x * sigmoid(2u) with u = sqrt(2/pi) (x + 0.044715 x^3).
inline constexpr float gelu_k = 0.7978845608028654f;
inline constexpr float gelu_c = 0.044715f;
inline vf gelu(vf x) {
  const vf u = splat(gelu_k) * (x + splat(gelu_c) * x * x * x);
  return x * sigmoid(u + u);
}
inline vf gelu_derivative(vf x) {
  const vf x2 = x * x;
  const vf u = splat(gelu_k) * (x + splat(gelu_c) * x2 * x);
  const vf s = sigmoid(u + u);
  const vf du = splat(2.0f * gelu_k) * (splat(1.0f) + splat(3.0f * gelu_c) * x2);
  return s + x * s * (splat(1.0f) - s) * du;
}
inline vf silu(vf x) {
  return x * sigmoid(x);
}
inline vf silu_derivative(vf x) {
  const vf s = sigmoid(x);
  return s * (splat(1.0f) + x * (splat(1.0f) - s));
}

// Lane indices 0..15.
inline vu iota_u() {
  vu v;
  for (int i = 0; i < lanes; ++i) v[i] = static_cast<std::uint32_t>(i);
  return v;
}

// loom::hash_u32 (random.hpp) on every lane.
inline vu hash_u32(vu x) {
  x ^= x >> 16;
  x *= splat_u(0x7feb352du);
  x ^= x >> 15;
  x *= splat_u(0x846ca68bu);
  x ^= x >> 16;
  return x;
}

}  // namespace loom::cpu
