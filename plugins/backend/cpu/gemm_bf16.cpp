// bf16 GEMM with float32 accumulation on AVX512-BF16 (VDPBF16PS), chosen at run time.
//
// Why our own kernel rather than a library: Debian's OpenBLAS 0.3.21 is built without its bf16
// routines (no cblas_sbgemm), and oneDNN's headers (libdnnl-dev) are not among the build's
// dependencies; this kernel is small, depends on nothing and reads the float32 operands
// directly, rounding them to bf16 while packing, so the float32 master weights need no bf16
// copy. It is not yet the fastest: `loom bench gemm` measures oneDNN's bf16 GEMM in the same run
// (docs/writing-a-backend.md, "Mixed precision", has the figures and the plan).
//
// Structure (GotoBLAS/BLIS): C is computed in blocks of kNc columns; for each block of kKc
// k-pairs, B's block is packed into kNr-column strips and A's rows into kMr-row strips; the
// micro-kernel keeps a kMr x kNr tile of C in 24 zmm registers (6 x 64 measured faster than
// 12 x 32 and 4 x 96 on Zen 5: fewer broadcasts per product). VDPBF16PS computes, per float32
// lane j, acc[j] += a[2j] b[2j] + a[2j+1] b[2j+1]: the packed layout therefore holds, for each
// pair p of k indices and each row r of a strip, the two bf16 values (X(r, 2p), X(r, 2p+1)) as
// one 32-bit word (A's word is broadcast, B's 16 words are a vector over 16 columns).
//
// Determinism: an element of C is the sum, in k order, of one float32 partial per kKc block,
// each accumulated in k order; nothing depends on the row panels or the thread count.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_backend.hpp"

namespace loom::cpu {

namespace {

constexpr int64_t kMr = 6;          // rows of the micro-tile
constexpr int64_t kNr = 64;         // columns of the micro-tile (four zmm of float32)
constexpr int64_t kKc = 128;        // k pairs per block (256 k): a packed B strip is 32 KiB
constexpr int64_t kMc = 192;        // rows per packed A block (a multiple of kMr)
constexpr int64_t kNc = 512;        // columns per packed B block (a multiple of kNr)
constexpr int64_t kPanelRows = 48;  // row panels start at multiples of this (a multiple of kMr)

#define LOOM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// A view of an operand as X(r, kk) = data[r * sr + kk * sk]: r is the row of A (or the column of
// B), kk runs along k.
struct Operand {
  const float* data;
  int64_t sr, sk;
};

// Packs X(r0 .. r0 + rows, 2 p0 .. 2 (p0 + pairs)) into `out`: for each pair p, `width` words, of
// which the first `rows` hold (bf16 X(r, 2p), bf16 X(r, 2p + 1)) and the rest zero. k indices at
// or past k read as zero.
LOOM_BF16_TARGET void pack(const Operand& x, int64_t r0, int64_t rows, int64_t width, int64_t p0, int64_t pairs,
                           int64_t k, std::uint32_t* out) {
  const int64_t k0 = 2 * p0;
  if (x.sk == 1) {
    // Pairs are contiguous in memory: convert 32 floats of each of 16 rows into 16 words, then
    // transpose the 16 x 16 block of words (gathers from L1) into 16 stores of 16 columns.
    const __m512i columns = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               _mm512_set1_epi32(16));
    alignas(64) std::uint32_t block[16][16];
    for (int64_t r = 0; r < width; r += 16) {
      const int64_t n_rows = std::max<int64_t>(0, std::min<int64_t>(16, rows - r));
      const int64_t n_store = std::min<int64_t>(16, width - r);
      const __mmask16 store_mask = static_cast<__mmask16>(n_store >= 16 ? 0xffff : (1u << n_store) - 1);
      for (int64_t p = 0; p < pairs; p += 16) {
        const int64_t kk = k0 + 2 * p;
        const int64_t left = std::max<int64_t>(0, std::min<int64_t>(32, k - kk));
        const __mmask16 lo_mask = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
        const __mmask16 hi_mask = static_cast<__mmask16>(left >= 32   ? 0xffff
                                                         : left <= 16 ? 0
                                                                      : (1u << (left - 16)) - 1);
        for (int64_t i = 0; i < 16; ++i) {
          __m512i words = _mm512_setzero_si512();
          if (i < n_rows) {
            const float* row = x.data + (r0 + r + i) * x.sr + kk;
            const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, row);
            const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, row + 16);
            words = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
          }
          _mm512_store_si512(reinterpret_cast<__m512i*>(block[i]), words);
        }
        const int64_t n_pairs = std::min<int64_t>(16, pairs - p);
        for (int64_t q = 0; q < n_pairs; ++q) {
          // Column q of the block: block[i][q] for i < 16.
          const __m512i word = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), 0xffff, columns, &block[0][q], 4);
          _mm512_mask_storeu_epi32(out + (p + q) * width + r, store_mask, word);
        }
      }
    }
    return;
  }
  // Rows are contiguous in memory (x.sr == 1) or strided: convert 16 rows of two k indices at a
  // time and interleave them.
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t kk = k0 + 2 * p;
    const float* even = x.data + kk * x.sk + r0 * x.sr;
    const float* odd = kk + 1 < k ? even + x.sk : nullptr;
    std::uint32_t* dst = out + p * width;
    for (int64_t r = 0; r < width; r += 16) {
      const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16, rows - r));
      const __mmask16 mask = static_cast<__mmask16>(n >= 16 ? 0xffff : (1u << n) - 1);
      __m512 e, o;
      if (x.sr == 1) {
        e = _mm512_maskz_loadu_ps(mask, even + r);
        o = odd ? _mm512_maskz_loadu_ps(mask, odd + r) : _mm512_setzero_ps();
      } else {
        alignas(64) float ev[16] = {}, ov[16] = {};
        for (int64_t q = 0; q < n; ++q) {
          ev[q] = even[(r + q) * x.sr];
          ov[q] = odd ? odd[(r + q) * x.sr] : 0.0f;
        }
        e = _mm512_load_ps(ev);
        o = _mm512_load_ps(ov);
      }
      const __m512i ew = _mm512_maskz_cvtepu16_epi32(0xffff, (__m256i)_mm512_cvtneps_pbh(e));
      const __m512i ow = _mm512_maskz_cvtepu16_epi32(0xffff, (__m256i)_mm512_cvtneps_pbh(o));
      const __m512i words = _mm512_or_si512(ew, _mm512_maskz_slli_epi32(0xffff, ow, 16));
      const int64_t stored = std::min<int64_t>(16, width - r);
      _mm512_mask_storeu_epi32(dst + r, static_cast<__mmask16>(stored >= 16 ? 0xffff : (1u << stored) - 1), words);
    }
  }
}

// C tile (rows x cols, rows <= kMr, cols <= kNr) = first ? alpha * AB + beta * C : C + alpha * AB,
// AB over `pairs` pairs of the packed strips a (kMr words per pair) and b (kNr words per pair).
// beta == 0 with `first` does not read C.
LOOM_BF16_TARGET void micro_kernel(const std::uint32_t* a, const std::uint32_t* b, int64_t pairs, float* c, int64_t ldc,
                                   int64_t rows, int64_t cols, float alpha, float beta, bool first) {
  constexpr int kNv = static_cast<int>(kNr / 16);  // zmm per row of the tile
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r)
#pragma GCC unroll 4
    for (int h = 0; h < kNv; ++h) acc[r][h] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[kNv];
#pragma GCC unroll 4
    for (int h = 0; h < kNv; ++h) bv[h] = (__m512bh)_mm512_loadu_si512(b + p * kNr + 16 * h);
    const std::uint32_t* ap = a + p * kMr;
#pragma GCC unroll 16
    for (int r = 0; r < kMr; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[r]));
#pragma GCC unroll 4
      for (int h = 0; h < kNv; ++h) acc[r][h] = _mm512_dpbf16_ps(acc[r][h], av, bv[h]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  // Unrolled with constant indices, so that acc stays in registers.
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) {
    if (r >= rows) break;
    float* row = c + r * ldc;
#pragma GCC unroll 4
    for (int h = 0; h < kNv; ++h) {
      const int64_t left = cols - 16 * h;
      if (left <= 0) break;
      const __mmask16 mask = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
      __m512 v = _mm512_mul_ps(va, acc[r][h]);
      if (!first)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, row + 16 * h), v);
      else if (beta != 0.0f)
        v = _mm512_add_ps(v, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mask, row + 16 * h)));
      _mm512_mask_storeu_ps(row + 16 * h, mask, v);
    }
  }
}

// The whole product on the calling thread, with scratch of its own.
LOOM_BF16_TARGET void gemm_bf16_single(const Operand& a, const Operand& b, int64_t m, int64_t n, int64_t k, float alpha,
                                       float beta, float* c, int64_t ldc) {
  thread_local std::vector<std::uint32_t> packed_a, packed_b;
  const int64_t k_pairs = (k + 1) / 2;
  packed_a.resize(static_cast<std::size_t>(kMc * kKc));
  packed_b.resize(static_cast<std::size_t>(kNc * kKc));
  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc);
    for (int64_t pc = 0; pc < k_pairs; pc += kKc) {
      const int64_t kc = std::min(kKc, k_pairs - pc);
      for (int64_t jr = 0; jr < nc; jr += kNr)
        pack(b, jc + jr, std::min(kNr, nc - jr), kNr, pc, kc, k, packed_b.data() + jr * kc);
      for (int64_t ic = 0; ic < m; ic += kMc) {
        const int64_t mc = std::min(kMc, m - ic);
        for (int64_t ir = 0; ir < mc; ir += kMr)
          pack(a, ic + ir, std::min(kMr, mc - ir), kMr, pc, kc, k, packed_a.data() + ir * kc);
        for (int64_t jr = 0; jr < nc; jr += kNr)
          for (int64_t ir = 0; ir < mc; ir += kMr)
            micro_kernel(packed_a.data() + ir * kc, packed_b.data() + jr * kc, kc, c + (ic + ir) * ldc + jc + jr, ldc,
                         std::min(kMr, mc - ir), std::min(kNr, nc - jr), alpha, beta, pc == 0);
      }
    }
  }
}

int64_t panel_start(int64_t n, int64_t i, int64_t p) {
  if (i >= p) return n;
  return std::min(n, (n * i / p + kPanelRows / 2) / kPanelRows * kPanelRows);
}

}  // namespace

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

void gemm_bf16_on_thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  gemm_bf16_single({a, ta ? 1 : lda, ta ? lda : 1}, {b, tb ? ldb : 1, tb ? 1 : ldb}, m, n, k, alpha, beta, c, ldc);
}

void CpuBackend::gemm_bf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                           int64_t ldc) {
  if (!has_bf16_ || m <= 0 || n <= 0 || k <= 0) {
    Backend::gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  // X(r, kk): A(i, kk) for A; B(kk, j) for B.
  const Operand oa{a, ta ? 1 : lda, ta ? lda : 1};
  const Operand ob{b, tb ? ldb : 1, tb ? 1 : ldb};
  const int64_t work = m * n * k;
  const int64_t panels = std::min<int64_t>(
      {ex_.num_threads(), m / kPanelRows, work / std::max<int64_t>(1, options_.gemm_parallel_min_work)});
  if (panels < 2) {
    gemm_bf16_single(oa, ob, m, n, k, alpha, beta, c, ldc);
    return;
  }
  ex_.parallel_for(panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t s = panel_start(m, p, panels), e = panel_start(m, p + 1, panels);
      if (s >= e) continue;
      const Operand rows{oa.data + s * oa.sr, oa.sr, oa.sk};
      gemm_bf16_single(rows, ob, e - s, n, k, alpha, beta, c + s * ldc, ldc);
    }
  });
}

}  // namespace loom::cpu
