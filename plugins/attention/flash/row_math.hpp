// Row operations of the flash kernel's tiles: max, exp with a shift (and its sum), soft-cap,
// scaling, the softmax gradient, dot products, and tile transposes. AVX-512 on CPUs that have it,
// chosen at run time (loom builds for x86-64-v3 by default: the AVX-512 versions carry a
// function-level target, as the bf16 tiles do), scalar loops otherwise; both give the same
// results to float32 rounding, and a build for AVX-512 (-march=native on such a CPU) gives the
// run-time choice's bits.
//
// exp is Cephes' expf polynomial after the usual reduction x = n ln2 + r (about 1 ulp), and
// returns exactly 0 below -87 (so masked scores, -inf, give probability 0).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#if defined(__x86_64__)
// GCC 12 reports its own AVX-512 intrinsics (which pass _mm512_undefined_ps() as the unused
// merge source) as "(may be) used uninitialized" once inlined; the warning is false and would
// fail the -Werror build, so it is silenced for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
// What the AVX-512 versions use (AVX512-DQ for the float and/or/andnot).
#define LOOM_FLASH_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,fma")))
#endif

namespace loom::flash {

using std::int64_t;

#if defined(__x86_64__)
namespace avx512 {

LOOM_FLASH_AVX512 inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << remaining) - 1u);
}

LOOM_FLASH_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.0f);
  const __mmask16 keep = _mm512_cmp_ps_mask(x, lowest, _CMP_GE_OQ);
  x = _mm512_min_ps(_mm512_max_ps(x, lowest), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(y, n));
}

LOOM_FLASH_AVX512 inline float row_max(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; j += 16)
    m = _mm512_mask_max_ps(m, tail_mask(n - j), m, _mm512_maskz_loadu_ps(tail_mask(n - j), x + j));
  return _mm512_reduce_max_ps(m);
}

// x = exp(x - shift); returns the sum of the new x.
LOOM_FLASH_AVX512 inline float exp_shift_sum(float* x, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    const __m512 e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), s)));
    _mm512_mask_storeu_ps(x + j, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  return _mm512_reduce_add_ps(sum);
}

// y = exp(x - shift).
LOOM_FLASH_AVX512 inline void exp_shift(const float* x, float* y, int64_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(y + j, k, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + j), s)));
  }
}

// x = cap * tanh(x / cap), with tanh(a) = sign(a) (1 - e) / (1 + e), e = exp(-2|a|).
LOOM_FLASH_AVX512 inline void softcap_row(float* x, int64_t n, float cap) {
  const __m512 c = _mm512_set1_ps(cap), inverse = _mm512_set1_ps(1.0f / cap), one = _mm512_set1_ps(1.0f);
  const __m512 sign_bit = _mm512_set1_ps(-0.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    const __m512 a = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), inverse);
    const __m512 magnitude = _mm512_andnot_ps(sign_bit, a);
    const __m512 e = exp16(_mm512_mul_ps(magnitude, _mm512_set1_ps(-2.0f)));
    const __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
    const __m512 signed_t = _mm512_or_ps(t, _mm512_and_ps(a, sign_bit));
    _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(signed_t, c));
  }
}

LOOM_FLASH_AVX512 inline void scale_row(float* x, int64_t n, float alpha) {
  const __m512 a = _mm512_set1_ps(alpha);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    _mm512_mask_storeu_ps(x + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), a));
  }
}

// The softmax backward of one row: dp = p * (dp - delta), times d(cap tanh(s/cap))/ds =
// 1 - (capped / cap)^2 when a cap is set (capped holds the soft-capped scores).
LOOM_FLASH_AVX512 inline void softmax_grad_row(float* dp, const float* p, const float* capped, int64_t n, float delta,
                                               float cap) {
  const __m512 d = _mm512_set1_ps(delta);
  const __m512 inverse = _mm512_set1_ps(cap > 0.0f ? 1.0f / cap : 0.0f), one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + j), d));
    if (cap > 0.0f) {
      const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, capped + j), inverse);
      g = _mm512_mul_ps(g, _mm512_fnmadd_ps(t, t, one));
    }
    _mm512_mask_storeu_ps(dp + j, k, g);
  }
}

LOOM_FLASH_AVX512 inline float dot(const float* a, const float* b, int64_t n) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = tail_mask(n - j);
    s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + j), _mm512_maskz_loadu_ps(k, b + j), s);
  }
  return _mm512_reduce_add_ps(s);
}

// t[c, r] = a[r, c] for a rows x cols block (row strides lda and ldt): 16 x 16 blocks in
// registers (the usual unpack / shuffle network), a plain loop for the ragged edges.
LOOM_FLASH_AVX512 inline void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float* t,
                                        int64_t ldt) {
  int64_t r0 = 0;
  for (; r0 + 16 <= rows; r0 += 16) {
    int64_t c0 = 0;
    for (; c0 + 16 <= cols; c0 += 16) {
      __m512 r[16], u[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(a + (r0 + i) * lda + c0);
      for (int i = 0; i < 16; i += 2) {
        u[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        u[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i]), _mm512_castps_pd(u[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u[i + 1]), _mm512_castps_pd(u[i + 3])));
      }
      for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; ++j) {
          u[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
          u[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xdd);
        }
      for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_f32x4(u[j], u[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_f32x4(u[j], u[j + 8], 0xdd);
      }
      for (int i = 0; i < 16; ++i) _mm512_storeu_ps(t + (c0 + i) * ldt + r0, r[i]);
    }
    for (int64_t r = r0; r < r0 + 16; ++r)
      for (int64_t c = c0; c < cols; ++c) t[c * ldt + r] = a[r * lda + c];
  }
  for (int64_t r = r0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * ldt + r] = a[r * lda + c];
}

}  // namespace avx512
#endif

namespace scalar {

inline float exp1(float x) {
  return x < -87.0f ? 0.0f : std::exp(x);
}

inline float row_max(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < n; ++j) m = std::max(m, x[j]);
  return m;
}
inline float exp_shift_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = exp1(x[j] - shift));
  return sum;
}
inline void exp_shift(const float* x, float* y, int64_t n, float shift) {
  for (int64_t j = 0; j < n; ++j) y[j] = exp1(x[j] - shift);
}
inline void softcap_row(float* x, int64_t n, float cap) {
  for (int64_t j = 0; j < n; ++j) x[j] = cap * std::tanh(x[j] / cap);
}
inline void scale_row(float* x, int64_t n, float alpha) {
  for (int64_t j = 0; j < n; ++j) x[j] *= alpha;
}
inline void softmax_grad_row(float* dp, const float* p, const float* capped, int64_t n, float delta, float cap) {
  for (int64_t j = 0; j < n; ++j) {
    float g = p[j] * (dp[j] - delta);
    if (cap > 0.0f) {
      const float t = capped[j] / cap;
      g *= 1.0f - t * t;
    }
    dp[j] = g;
  }
}
inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.0f;
  for (int64_t j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

inline void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float* t, int64_t ldt) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * ldt + r] = a[r * lda + c];
}

}  // namespace scalar

// Whether this CPU runs the AVX-512 versions: known at compile time in a build for AVX-512,
// else decided once, when the plugin is loaded.
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
inline constexpr bool use_avx512 = true;
#elif defined(__x86_64__)
inline const bool use_avx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}();
#else
namespace avx512 = scalar;  // never chosen
inline constexpr bool use_avx512 = false;
#endif

inline float row_max(const float* x, int64_t n) {
  return use_avx512 ? avx512::row_max(x, n) : scalar::row_max(x, n);
}
// x = exp(x - shift); returns the sum of the new x.
inline float exp_shift_sum(float* x, int64_t n, float shift) {
  return use_avx512 ? avx512::exp_shift_sum(x, n, shift) : scalar::exp_shift_sum(x, n, shift);
}
// y = exp(x - shift).
inline void exp_shift(const float* x, float* y, int64_t n, float shift) {
  use_avx512 ? avx512::exp_shift(x, y, n, shift) : scalar::exp_shift(x, y, n, shift);
}
// x = cap * tanh(x / cap).
inline void softcap_row(float* x, int64_t n, float cap) {
  use_avx512 ? avx512::softcap_row(x, n, cap) : scalar::softcap_row(x, n, cap);
}
inline void scale_row(float* x, int64_t n, float alpha) {
  use_avx512 ? avx512::scale_row(x, n, alpha) : scalar::scale_row(x, n, alpha);
}
// The softmax backward of one row: dp = p * (dp - delta), times 1 - (capped / cap)^2 when a cap
// is set (capped holds the soft-capped scores).
inline void softmax_grad_row(float* dp, const float* p, const float* capped, int64_t n, float delta, float cap) {
  use_avx512 ? avx512::softmax_grad_row(dp, p, capped, n, delta, cap)
             : scalar::softmax_grad_row(dp, p, capped, n, delta, cap);
}
inline float dot(const float* a, const float* b, int64_t n) {
  return use_avx512 ? avx512::dot(a, b, n) : scalar::dot(a, b, n);
}
// t[c, r] = a[r, c] for a rows x cols block (row strides lda and ldt).
inline void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float* t, int64_t ldt) {
  use_avx512 ? avx512::transpose(a, rows, cols, lda, t, ldt) : scalar::transpose(a, rows, cols, lda, t, ldt);
}

}  // namespace loom::flash
