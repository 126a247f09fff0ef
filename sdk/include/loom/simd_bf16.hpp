// Building blocks of AVX512-BF16 kernels (VDPBF16PS with float32 accumulation), for CPU plugins:
// the cpu backend's bf16 GEMM and flash attention's bf16 tile products use them, and so may an
// out-of-tree kernel. Header-only, x86-64 only; every function carries LOOM_AVX512_BF16 (a
// function-level target), so a plugin built for any x86-64 CPU calls them only after
// cpu_has_avx512_bf16() said yes at run time.
#pragma once

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstdint>

// The instruction sets these functions need; put it on every function that calls them (GCC
// inlines only into callers with the same or more target features).
#define LOOM_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

namespace loom::simd {

// Whether this CPU runs LOOM_AVX512_BF16 code: AVX512-BF16 with AVX512-BW and -VL.
inline bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

// The mask of the first n of 16 lanes (n <= 0: none, n >= 16: all).
LOOM_AVX512_BF16 inline __mmask16 mask16(std::int64_t n) {
  return n >= 16  ? static_cast<__mmask16>(0xffff)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1u);
}

// Transposes the 16 x 16 matrix of 32-bit words r[0..16) in place: word j of r[i] becomes word i
// of r[j]. Three rounds of shuffles (within 128-bit lanes: 32-bit, then 64-bit interleaves; then
// whole 128-bit lanes twice). With words that hold bf16 pairs, it turns 16 rows of 32 k values
// into 16 k-pairs of 16 rows: the layout VDPBF16PS reads.
LOOM_AVX512_BF16 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi32(0xffff, r[i], r[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(0xffff, r[i], r[i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_maskz_unpacklo_epi64(0xff, t[i], t[i + 2]);
    r[i + 1] = _mm512_maskz_unpackhi_epi64(0xff, t[i], t[i + 2]);
    r[i + 2] = _mm512_maskz_unpacklo_epi64(0xff, t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_maskz_unpackhi_epi64(0xff, t[i + 1], t[i + 3]);
  }
  // r[4b + c] now holds, in 128-bit lane l, words 4l + c of rows 4b .. 4b + 3.
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_maskz_shuffle_i32x4(0xffff, r[c], r[4 + c], 0x88);      // lanes 0, 2 of rows 0-3, 4-7
    t[4 + c] = _mm512_maskz_shuffle_i32x4(0xffff, r[c], r[4 + c], 0xdd);  // lanes 1, 3
    t[8 + c] = _mm512_maskz_shuffle_i32x4(0xffff, r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_maskz_shuffle_i32x4(0xffff, r[8 + c], r[12 + c], 0xdd);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_maskz_shuffle_i32x4(0xffff, t[c], t[8 + c], 0x88);            // word c of lane 0
    r[8 + c] = _mm512_maskz_shuffle_i32x4(0xffff, t[c], t[8 + c], 0xdd);        // lane 2
    r[4 + c] = _mm512_maskz_shuffle_i32x4(0xffff, t[4 + c], t[12 + c], 0x88);   // lane 1
    r[12 + c] = _mm512_maskz_shuffle_i32x4(0xffff, t[4 + c], t[12 + c], 0xdd);  // lane 3
  }
}

// The register tile of a bf16 product: acc[r][h] = the sum over pairs p < `pairs` of VDPBF16PS of
// A's word (r, p) (two bf16 values of row r, at rows[r][p * a_pair], broadcast) with B's 16 words
// of pair p at b + p * b_pair + 16 h. acc is zeroed first. R x NV accumulators, NV B vectors and
// one broadcast must fit the 32 zmm registers; always inlined, so that they stay there.
template <int R, int NV>
LOOM_AVX512_BF16 __attribute__((always_inline)) inline void dpbf16_tile(__m512 (&acc)[R][NV],
                                                                        const std::uint32_t* const (&rows)[R],
                                                                        std::int64_t a_pair, const std::uint32_t* b,
                                                                        std::int64_t b_pair, std::int64_t pairs) {
  static_assert(R * NV + NV + 1 <= 32, "the tile must fit the zmm registers");
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int h = 0; h < NV; ++h) acc[r][h] = _mm512_setzero_ps();
  for (std::int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int h = 0; h < NV; ++h) bv[h] = (__m512bh)_mm512_loadu_si512(b + p * b_pair + 16 * h);
    const std::int64_t at = p * a_pair;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(rows[r][at]));
#pragma GCC unroll 4
      for (int h = 0; h < NV; ++h) acc[r][h] = _mm512_dpbf16_ps(acc[r][h], av, bv[h]);
    }
  }
}

}  // namespace loom::simd

#endif  // __x86_64__
