// The flash kernel's bf16 tile products: see bf16_tiles.hpp. The transpose of 16 x 16 words and
// the lane masks come from the SDK (loom/simd_bf16.hpp), shared with the cpu backend's bf16 GEMM.
#include "bf16_tiles.hpp"

#include <algorithm>

#if defined(__x86_64__)
// As in row_math.hpp: GCC 12's AVX-512 intrinsics (which pass an undefined vector as the unused
// merge source) trip a false -W(maybe-)uninitialized once inlined, here in _mm512_reduce_add_ps.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>

#include <loom/simd_bf16.hpp>
#pragma GCC diagnostic pop
#endif

namespace loom::flash::bf16 {

#if defined(__x86_64__)

namespace {

#define LOOM_FLASH_BF16 LOOM_AVX512_BF16
using loom::simd::mask16;
using loom::simd::transpose16;

// 32 floats of a row from x (16 + 16, zero past `left`) as 16 words of bf16 pairs.
LOOM_FLASH_BF16 inline __m512i row_words(const float* x, int64_t left) {
  const __m512 lo = _mm512_maskz_loadu_ps(mask16(left), x);
  const __m512 hi = _mm512_maskz_loadu_ps(mask16(left - 16), x + 16);
  return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
}

constexpr int kRows = 6;  // rows of C per strip: 6 x 4 accumulators, 4 B vectors, 1 broadcast

// C strip rows [0, m) (m <= kRows... rows past m repeat row m - 1 and are not stored) and columns
// [0, n) with n <= 16 NV: A(r, p) words broadcast, B(p, 16 h .. 16 h + 15) words as vectors.
template <int NV>
LOOM_FLASH_BF16 void strip(const uint32_t* a, int64_t a_row, int64_t a_pair, int64_t m, const uint32_t* b,
                           int64_t b_pair, int64_t n, int64_t pairs, float alpha, bool accumulate, float* c,
                           int64_t ldc) {
  const uint32_t* rows[kRows];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) rows[r] = a + std::min<int64_t>(r, m - 1) * a_row;
  __m512 acc[kRows][NV];
  loom::simd::dpbf16_tile<kRows, NV>(acc, rows, a_pair, b, b_pair, pairs);
  const __m512 va = _mm512_set1_ps(alpha);
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
    if (r >= m) break;
    float* row = c + r * ldc;
#pragma GCC unroll 4
    for (int h = 0; h < NV; ++h) {
      const __mmask16 k = mask16(n - 16 * h);
      // An explicit FMA: under -ffp-contract=fast GCC fused a _mm512_mul_ps and _mm512_add_ps or
      // not depending on inlining, so an unrelated edit changed results.
      const __m512 v = accumulate ? _mm512_fmadd_ps(va, acc[r][h], _mm512_maskz_loadu_ps(k, row + 16 * h))
                                  : _mm512_mul_ps(va, acc[r][h]);
      _mm512_mask_storeu_ps(row + 16 * h, k, v);
    }
  }
}

}  // namespace

bool cpu_supported() {
  return loom::simd::cpu_has_avx512_bf16();
}

LOOM_FLASH_BF16 void pack_rows(const float* x, int64_t rows, int64_t k, int64_t ldx, uint32_t* out, int64_t ld) {
  const int64_t pairs = pairs_of(k);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t kk = 0; kk < k; kk += 32)
      _mm512_mask_storeu_epi32(out + r * ld + kk / 2, mask16(pairs - kk / 2), row_words(x + r * ldx + kk, k - kk));
}

LOOM_FLASH_BF16 void pack_column_pairs(const float* x, int64_t rows, int64_t k, int64_t ldx, uint32_t* out,
                                       int64_t width) {
  const int64_t pairs = pairs_of(k);
  for (int64_t r0 = 0; r0 < width; r0 += 16) {
    for (int64_t p0 = 0; p0 < pairs; p0 += 16) {
      __m512i block[16];
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i)
        block[i] = r0 + i < rows ? row_words(x + (r0 + i) * ldx + 2 * p0, k - 2 * p0) : _mm512_setzero_si512();
      transpose16(block);
      const int64_t n = std::min<int64_t>(16, pairs - p0);
#pragma GCC unroll 16
      for (int q = 0; q < 16; ++q)
        if (q < n) _mm512_storeu_si512(out + (p0 + q) * width + r0, block[q]);
    }
  }
}

LOOM_FLASH_BF16 void pack_row_pairs(const float* x, int64_t rows, int64_t n, int64_t ldx, uint32_t* out,
                                    int64_t width) {
  // cvtne2ps gives the even row's 16 bf16 values, then the odd row's; the permutation interleaves
  // them into 16 words (even, odd).
  alignas(64) static constexpr unsigned short interleave[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                                                21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                                                11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i index = _mm512_load_si512(interleave);
  for (int64_t p = 0; p < pairs_of(rows); ++p) {
    const float* even = x + 2 * p * ldx;
    const bool has_odd = 2 * p + 1 < rows;
    for (int64_t c = 0; c < width; c += 16) {
      const __mmask16 k = mask16(n - c);
      const __m512 e = _mm512_maskz_loadu_ps(k, even + c);
      const __m512 o = has_odd ? _mm512_maskz_loadu_ps(k, even + ldx + c) : _mm512_setzero_ps();
      const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(o, e);
      _mm512_storeu_si512(out + p * width + c, _mm512_maskz_permutexvar_epi16(~__mmask32{0}, index, both));
    }
  }
}

LOOM_FLASH_BF16 float dot_rounded(const float* x, const float* y, int64_t n) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = mask16(n - j);
    const __m512 rounded = _mm512_cvtpbh_ps(_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, x + j)));
    sum = _mm512_fmadd_ps(rounded, _mm512_maskz_loadu_ps(k, y + j), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

LOOM_FLASH_BF16 void product(const uint32_t* a, int64_t a_row, int64_t a_pair, int64_t m, const uint32_t* b,
                             int64_t b_pair, int64_t n, int64_t pairs, float alpha, bool accumulate, float* c,
                             int64_t ldc) {
  for (int64_t j = 0; j < n; j += 64) {
    const int64_t cols = std::min<int64_t>(64, n - j);
    for (int64_t r = 0; r < m; r += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, m - r);
      const uint32_t* ar = a + r * a_row;
      float* cr = c + r * ldc + j;
      switch ((cols + 15) / 16) {
        case 4:
          strip<4>(ar, a_row, a_pair, rows, b + j, b_pair, cols, pairs, alpha, accumulate, cr, ldc);
          break;
        case 3:
          strip<3>(ar, a_row, a_pair, rows, b + j, b_pair, cols, pairs, alpha, accumulate, cr, ldc);
          break;
        case 2:
          strip<2>(ar, a_row, a_pair, rows, b + j, b_pair, cols, pairs, alpha, accumulate, cr, ldc);
          break;
        default:
          strip<1>(ar, a_row, a_pair, rows, b + j, b_pair, cols, pairs, alpha, accumulate, cr, ldc);
      }
    }
  }
}

#else  // not x86-64: no bf16 path (the kernel computes float32)

bool cpu_supported() {
  return false;
}
void pack_rows(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_column_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
void pack_row_pairs(const float*, int64_t, int64_t, int64_t, uint32_t*, int64_t) {}
float dot_rounded(const float*, const float*, int64_t) {
  return 0.0f;
}
void product(const uint32_t*, int64_t, int64_t, int64_t, const uint32_t*, int64_t, int64_t, int64_t, float, bool,
             float*, int64_t) {}

#endif

}  // namespace loom::flash::bf16
