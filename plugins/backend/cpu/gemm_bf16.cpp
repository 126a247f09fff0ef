// bf16 GEMM with float32 accumulation on AVX512-BF16 (VDPBF16PS), chosen at run time.
//
// Why our own kernel rather than a library: Debian's OpenBLAS 0.3.21 is built without its bf16
// routines (no cblas_sbgemm), and oneDNN's headers (libdnnl-dev) are not among the build's
// dependencies; this kernel is small, depends on nothing and reads the float32 operands
// directly, rounding them to bf16 while packing, so the float32 master weights need no bf16
// copy. It is not yet the fastest: `loom bench gemm` measures oneDNN's bf16 GEMM in the same run
// (docs/writing-a-backend.md, "Mixed precision", has the figures and the plan).
//
// Structure (GotoBLAS/BLIS): A's rows are packed once into kMr-row strips for the whole of k; C
// is computed in blocks of kNc columns; for each block of kKc k-pairs, B's block is packed into
// kNr-column strips; the
// micro-kernel keeps a kMr x kNr tile of C in 24 zmm registers (6 x 64 measured faster than
// 12 x 32 and 4 x 96 on Zen 5: fewer broadcasts per product). VDPBF16PS computes, per float32
// lane j, acc[j] += a[2j] b[2j] + a[2j+1] b[2j+1]: the packed layout therefore holds, for each
// pair p of k indices and each row r of a strip, the two bf16 values (X(r, 2p), X(r, 2p+1)) as
// one 32-bit word (A's word is broadcast, B's 16 words are a vector over 16 columns).
//
// Determinism: an element of C is the sum, in k order, of one float32 partial per kKc block,
// each accumulated in k order; nothing depends on the panels (of rows or of columns) or the
// thread count.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <loom/simd_bf16.hpp>
#include <vector>

#include "cpu_backend.hpp"

namespace loom::cpu {

namespace {

constexpr int64_t kMr = 6;   // rows of the micro-tile
constexpr int64_t kNr = 64;  // columns of the micro-tile (four zmm of float32)
// Blocks: a packed B strip (kKc x kNr words, 128 KiB) streams from L2 (Zen 5: 48 KiB L1, 1 MiB
// L2), beside the packed A block (kMc x kKc, 384 KiB) and B block (kKc x kNc, 512 KiB).
// kKc = 512 pairs takes all of k = 768 and of the weight gradients' k = 1024 (tokens per step)
// in one block: C is read and written once. 384 pairs (768 k) measured 10% less CPU time than
// 128 on GPT-2's products; 512 another 4-7% less on the k = 1024 and 3072 ones.
constexpr int64_t kKc = 512;        // k pairs per block (1024 k)
constexpr int64_t kMc = 192;        // rows per packed A block (a multiple of kMr)
constexpr int64_t kNc = 256;        // columns per packed B block (a multiple of kNr)
constexpr int64_t kPanelRows = 48;  // row panels start at multiples of this (a multiple of kMr)

#define LOOM_BF16_TARGET LOOM_AVX512_BF16
using simd::mask16;
using simd::transpose16;

// A view of an operand as X(r, kk) = data[r * sr + kk * sk]: r is the row of A (or the column of
// B), kk runs along k.
struct Operand {
  const float* data;
  int64_t sr, sk;
};

// The 16 words (bf16 e[j], bf16 o[j]) of two rows of k (k and k + 1) over 16 lanes.
LOOM_BF16_TARGET inline __m512i pair_words(__m512 e, __m512 o) {
  const __m512i ew = _mm512_maskz_cvtepu16_epi32(0xffff, (__m256i)_mm512_cvtneps_pbh(e));
  const __m512i ow = _mm512_maskz_cvtepu16_epi32(0xffff, (__m256i)_mm512_cvtneps_pbh(o));
  return _mm512_or_si512(ew, _mm512_maskz_slli_epi32(0xffff, ow, 16));
}

// pair_words of even[0 .. n) and odd[0 .. n) (odd null: zero), n <= 16, zero past n.
LOOM_BF16_TARGET inline __m512i load_pair_words(const float* even, const float* odd, int64_t n) {
  const __mmask16 mask = mask16(n);
  return pair_words(_mm512_maskz_loadu_ps(mask, even), odd ? _mm512_maskz_loadu_ps(mask, odd) : _mm512_setzero_ps());
}

// Packs X(r0 .. r0 + rows, 2 p0 .. 2 (p0 + pairs)) into `out`: for each pair p, `width` words, of
// which the first `rows` hold (bf16 X(r, 2p), bf16 X(r, 2p + 1)) and the rest zero. k indices at
// or past k read as zero.
LOOM_BF16_TARGET void pack(const Operand& x, int64_t r0, int64_t rows, int64_t width, int64_t p0, int64_t pairs,
                           int64_t k, std::uint32_t* out) {
  const int64_t k0 = 2 * p0;
  if (x.sk == 1) {
    // Pairs are contiguous in memory: convert 32 floats of each of 16 rows into 16 words, then
    // transpose the 16 x 16 block of words in registers (transpose16, measured about four times
    // cheaper than a gather per column on Zen 5) into 16 stores of 16 columns.
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
        __m512i block[16];
#pragma GCC unroll 16
        for (int i = 0; i < 16; ++i) {
          block[i] = _mm512_setzero_si512();
          if (i < n_rows) {
            const float* row = x.data + (r0 + r + i) * x.sr + kk;
            const __m512 lo = _mm512_maskz_loadu_ps(lo_mask, row);
            const __m512 hi = _mm512_maskz_loadu_ps(hi_mask, row + 16);
            block[i] = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
          }
        }
        transpose16(block);
        const int64_t n_pairs = std::min<int64_t>(16, pairs - p);
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q)
          if (q < n_pairs) _mm512_mask_storeu_epi32(out + (p + q) * width + r, store_mask, block[q]);
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
      _mm512_mask_storeu_epi32(dst + r, mask16(width - r), pair_words(e, o));
    }
  }
}

// C tile (rows x cols, rows <= kMr, cols <= kNr) = first ? alpha * AB + beta * C : C + alpha * AB,
// AB over `pairs` pairs of the packed strips a and b (kNr words per pair). A's strip holds kMr
// words per pair (word r of pair p at a[p * kMr + r]), or, with kRowsA, one run of `pairs` words
// per row (a[r * pairs + p]: what pack_a_rows writes without a transpose). beta == 0 with
// `first` does not read C.
template <bool kRowsA>
LOOM_BF16_TARGET void micro_kernel(const std::uint32_t* a, const std::uint32_t* b, int64_t pairs, float* c, int64_t ldc,
                                   int64_t rows, int64_t cols, float alpha, float beta, bool first) {
  constexpr int kNv = static_cast<int>(kNr / 16);  // zmm per row of the tile
  __m512 acc[kMr][kNv];
  const std::uint32_t* a_rows[kMr];
#pragma GCC unroll 16
  for (int r = 0; r < kMr; ++r) a_rows[r] = a + r * (kRowsA ? pairs : 1);
  simd::dpbf16_tile<kMr, kNv>(acc, a_rows, kRowsA ? 1 : kMr, b, kNr, pairs);
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
      // Explicit FMAs: under -ffp-contract=fast GCC fuses a _mm512_mul_ps and _mm512_add_ps or
      // not depending on how the code around them inlines, so an unrelated edit changed results.
      __m512 v;
      if (!first)
        v = _mm512_fmadd_ps(va, acc[r][h], _mm512_maskz_loadu_ps(mask, row + 16 * h));
      else if (beta != 0.0f)
        v = _mm512_fmadd_ps(va, acc[r][h], _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(mask, row + 16 * h)));
      else
        v = _mm512_mul_ps(va, acc[r][h]);
      _mm512_mask_storeu_ps(row + 16 * h, mask, v);
    }
  }
}

// Packs the strip of A's rows r0 .. r0 + rows (rows <= kMr) over pairs p0 .. p0 + pairs into
// `out` row by row (word p of row r at out[r * pairs + p], micro_kernel<true>'s layout), for
// row-major A (x.sk == 1): each row's 32 floats become 16 words with one conversion, stored as
// they are (the kMr-words-per-pair layout needed a 16 x 6 transpose of scalar moves here, a
// sixth of the packing time).
LOOM_BF16_TARGET void pack_a_rows(const Operand& x, int64_t r0, int64_t rows, int64_t p0, int64_t pairs, int64_t k,
                                  std::uint32_t* out) {
  for (int64_t r = 0; r < kMr; ++r) {
    const float* row = x.data + (r0 + r) * x.sr;
    std::uint32_t* dst = out + r * pairs;
    for (int64_t p = 0; p < pairs; p += 16) {
      const int64_t n_pairs = std::min<int64_t>(16, pairs - p);
      const __mmask16 store_mask = static_cast<__mmask16>(n_pairs >= 16 ? 0xffff : (1u << n_pairs) - 1);
      __m512i words = _mm512_setzero_si512();
      if (r < rows) {
        const int64_t kk = 2 * (p0 + p);
        const int64_t left = std::max<int64_t>(0, std::min<int64_t>(32, k - kk));
        const __mmask16 lo_mask = static_cast<__mmask16>(left >= 16 ? 0xffff : (1u << left) - 1);
        const __mmask16 hi_mask = static_cast<__mmask16>(left >= 32   ? 0xffff
                                                         : left <= 16 ? 0
                                                                      : (1u << (left - 16)) - 1);
        words = (__m512i)_mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi_mask, row + kk + 16),
                                             _mm512_maskz_loadu_ps(lo_mask, row + kk));
      }
      _mm512_mask_storeu_epi32(dst + p, store_mask, words);
    }
  }
}

// Pairs ahead that the packing loops over k rows prefetch: the rows are a stride apart (a k row
// of the weights, or of the output gradient), each a separate stream that the hardware
// prefetchers pick up late; the loads were most of the packing time.
constexpr int64_t kPrefetchPairs = 4;

// Prefetches the cache line at p into L1. Inline assembly: GCC 12 at -O2 drops
// __builtin_prefetch (and _mm_prefetch) inside these loops.
inline void prefetch_line(const char* p) {
  asm volatile("prefetcht0 %0" : : "m"(*p));
}

// Prefetches X(r0 .. r0 + rows, kk) and X(.., kk + 1), for an X whose rows are contiguous
// (x.sr == 1), into L1.
inline void prefetch_rows(const Operand& x, int64_t r0, int64_t rows, int64_t kk, int64_t k) {
  if (kk >= k) return;
  const char* even = reinterpret_cast<const char*>(x.data + kk * x.sk + r0);
  const int64_t bytes = rows * static_cast<int64_t>(sizeof(float));
  for (int64_t b = 0; b < bytes; b += 64) prefetch_line(even + b);
  if (kk + 1 < k) {
    const char* odd = even + x.sk * static_cast<int64_t>(sizeof(float));
    for (int64_t b = 0; b < bytes; b += 64) prefetch_line(odd + b);
  }
}

// Packs the block of B's columns c0 .. c0 + cols over pairs p0 .. p0 + pairs into kNr-column
// strips (strip s at out + s * kNr * pairs, as pack with width kNr lays it out), for B whose
// columns are contiguous in memory (x.sr == 1: the weights in the forward pass). Pair by pair
// across the whole block, so that each k row is read as one contiguous run of the block's width
// (strip by strip, the rows were revisited once per strip, a quarter of a KiB at a time).
LOOM_BF16_TARGET void pack_b_columns(const Operand& x, int64_t c0, int64_t cols, int64_t p0, int64_t pairs, int64_t k,
                                     std::uint32_t* out) {
  const int64_t width = (cols + kNr - 1) / kNr * kNr;
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t kk = 2 * (p0 + p);
    const float* even = x.data + kk * x.sk + c0;
    const float* odd = kk + 1 < k ? even + x.sk : nullptr;
    prefetch_rows(x, c0, cols, kk + 2 * kPrefetchPairs, k);
    for (int64_t r = 0; r < width; r += 16) {
      _mm512_storeu_si512(out + (r / kNr) * kNr * pairs + p * kNr + r % kNr,
                          load_pair_words(even + r, odd ? odd + r : nullptr, cols - r));
    }
  }
}

// Packs up to 8 strips of A (rows r0 .. r0 + rows, rows <= 8 kMr) over pairs p0 .. p0 + pairs,
// strip s at out + s * strip_stride, for A whose rows are contiguous in memory (x.sr == 1: the
// weight gradients' A = X^T). Each k row is read 48 floats at a time, whole cache lines, rather
// than 6 floats per strip (which read every line of A's k rows once per strip).
LOOM_BF16_TARGET void pack_a_columns(const Operand& x, int64_t r0, int64_t rows, int64_t p0, int64_t pairs, int64_t k,
                                     int64_t strip_stride, std::uint32_t* out) {
  constexpr int64_t kRows = 8 * kMr;
  const int64_t strips = (rows + kMr - 1) / kMr;
  alignas(64) std::uint32_t words[kRows];
  for (int64_t p = 0; p < pairs; ++p) {
    const int64_t kk = 2 * (p0 + p);
    const float* even = x.data + kk * x.sk + r0;
    const float* odd = kk + 1 < k ? even + x.sk : nullptr;
    prefetch_rows(x, r0, rows, kk + 2 * kPrefetchPairs, k);
    for (int64_t r = 0; r < strips * kMr; r += 16) {
      _mm512_store_si512(reinterpret_cast<__m512i*>(words + r),
                         load_pair_words(even + r, odd ? odd + r : nullptr, rows - r));
    }
    for (int64_t st = 0; st < strips; ++st)
      _mm256_mask_storeu_epi32(out + st * strip_stride + p * kMr, 0x3f,
                               _mm256_maskz_loadu_epi32(0x3f, words + st * kMr));
  }
}

// Strips ir0 .. ir0 + rows of A (kMr words per pair; strip ir at out + ir * pairs), by the
// fastest route for A's layout.
// Whether pack_a lays A's strips out row by row (pack_a_rows, for micro_kernel<true>) rather than
// kMr words per pair.
bool packs_rows(const Operand& a) {
  return a.sk == 1;
}

LOOM_BF16_TARGET void pack_a(const Operand& a, int64_t ir0, int64_t rows, int64_t p0, int64_t pairs, int64_t k,
                             std::uint32_t* out) {
  if (a.sr == 1 && !packs_rows(a)) {
    for (int64_t ir = ir0; ir < ir0 + rows; ir += 8 * kMr)
      pack_a_columns(a, ir, std::min(8 * kMr, ir0 + rows - ir), p0, pairs, k, kMr * pairs, out + ir * pairs);
    return;
  }
  for (int64_t ir = ir0; ir < ir0 + rows; ir += kMr) {
    if (a.sk == 1)
      pack_a_rows(a, ir, std::min(kMr, ir0 + rows - ir), p0, pairs, k, out + ir * pairs);
    else
      pack(a, ir, std::min(kMr, ir0 + rows - ir), kMr, p0, pairs, k, out + ir * pairs);
  }
}

// Fully packed operands. Block pc (k pairs pc .. pc + kc, pc a multiple of kKc) of a packed A
// starts at m_pad * pc, and the strip of its rows ir .. ir + kMr at block + ir * kc; likewise a
// packed B's block at n_pad * pc, the strip of its columns j .. j + kNr at block + j * kc.
int64_t round_up(int64_t x, int64_t to) {
  return (x + to - 1) / to * to;
}

// Packs B's columns c0 .. c0 + cols over pairs pc .. pc + kc, the strip of column c0 + j at
// out + j * kc.
LOOM_BF16_TARGET void pack_b_block(const Operand& b, int64_t c0, int64_t cols, int64_t pc, int64_t kc, int64_t k,
                                   std::uint32_t* out) {
  if (b.sr == 1 && b.sk != 1) {
    pack_b_columns(b, c0, cols, pc, kc, k, out);
    return;
  }
  for (int64_t jr = 0; jr < cols; jr += kNr) pack(b, c0 + jr, std::min(kNr, cols - jr), kNr, pc, kc, k, out + jr * kc);
}

// A's rows r0 .. r1 (r0 a multiple of kMr), all of k, into a packed A of m_pad rows.
LOOM_BF16_TARGET void pack_a_full(const Operand& a, int64_t r0, int64_t r1, int64_t k, int64_t m_pad,
                                  std::uint32_t* out) {
  const int64_t k_pairs = (k + 1) / 2;
  for (int64_t pc = 0; pc < k_pairs; pc += kKc)
    pack_a(a, r0, r1 - r0, pc, std::min(kKc, k_pairs - pc), k, out + m_pad * pc);
}

// B's columns c0 .. c1 (c0 a multiple of kNr), all of k, into a packed B of n_pad columns.
LOOM_BF16_TARGET void pack_b_full(const Operand& b, int64_t c0, int64_t c1, int64_t k, int64_t n_pad,
                                  std::uint32_t* out) {
  const int64_t k_pairs = (k + 1) / 2;
  for (int64_t pc = 0; pc < k_pairs; pc += kKc) {
    const int64_t kc = std::min(kKc, k_pairs - pc);
    pack_b_block(b, c0, c1 - c0, pc, kc, k, out + n_pad * pc + c0 * kc);
  }
}

// C's columns j0 .. j1 (all m rows) from a packed A: B is packed block by block (kNc columns x
// kKc pairs) into the calling thread's scratch, each block right before the micro-kernels that
// read it. An element of C is summed over the k blocks in order (the first writes C).
LOOM_BF16_TARGET void compute_with_packed_a(const std::uint32_t* packed_a, bool rows_a, int64_t m_pad, const Operand& b,
                                            int64_t j0, int64_t j1, int64_t m, int64_t k, float alpha, float beta,
                                            float* c, int64_t ldc) {
  thread_local std::vector<std::uint32_t> packed_b;
  packed_b.resize(static_cast<std::size_t>(kNc * kKc));
  const int64_t k_pairs = (k + 1) / 2;
  for (int64_t jc = j0; jc < j1; jc += kNc) {
    const int64_t nc = std::min(kNc, j1 - jc);
    for (int64_t pc = 0; pc < k_pairs; pc += kKc) {
      const int64_t kc = std::min(kKc, k_pairs - pc);
      pack_b_block(b, jc, nc, pc, kc, k, packed_b.data());
      const std::uint32_t* block_a = packed_a + m_pad * pc;
      for (int64_t ic = 0; ic < m; ic += kMc) {
        const int64_t mc = std::min(kMc, m - ic);
        for (int64_t jr = 0; jr < nc; jr += kNr)
          for (int64_t ir = ic; ir < ic + mc; ir += kMr)
            (rows_a ? micro_kernel<true> : micro_kernel<false>)(block_a + ir * kc, packed_b.data() + jr * kc, kc,
                                                                c + ir * ldc + jc + jr, ldc, std::min(kMr, m - ir),
                                                                std::min(kNr, nc - jr), alpha, beta, pc == 0);
      }
    }
  }
}

// C's rows i0 .. i1 (all n columns) from a packed B: A is packed block by block (kMc rows x kKc
// pairs) into the calling thread's scratch, each block right before the micro-kernels that read
// it, so a tall A (the output layer's weight gradient: 50257 rows) streams through the cache
// once instead of being packed whole and read back once per block of B's columns.
LOOM_BF16_TARGET void compute_with_packed_b(const Operand& a, const std::uint32_t* packed_b, int64_t n_pad, int64_t i0,
                                            int64_t i1, int64_t n, int64_t k, float alpha, float beta, float* c,
                                            int64_t ldc) {
  thread_local std::vector<std::uint32_t> packed_a;
  packed_a.resize(static_cast<std::size_t>(kMc * kKc));
  const bool rows_a = packs_rows(a);
  const int64_t k_pairs = (k + 1) / 2;
  for (int64_t ic = i0; ic < i1; ic += kMc) {
    const int64_t mc = std::min(kMc, i1 - ic);
    const Operand block{a.data + ic * a.sr, a.sr, a.sk};
    for (int64_t pc = 0; pc < k_pairs; pc += kKc) {
      const int64_t kc = std::min(kKc, k_pairs - pc);
      pack_a(block, 0, mc, pc, kc, k, packed_a.data());
      const std::uint32_t* block_b = packed_b + n_pad * pc;
      for (int64_t jr = 0; jr < n; jr += kNr)
        for (int64_t ir = 0; ir < mc; ir += kMr)
          (rows_a ? micro_kernel<true> : micro_kernel<false>)(packed_a.data() + ir * kc, block_b + jr * kc, kc,
                                                              c + (ic + ir) * ldc + jr, ldc, std::min(kMr, mc - ir),
                                                              std::min(kNr, n - jr), alpha, beta, pc == 0);
    }
  }
}

// The product on the calling thread, with scratch of its own: the smaller operand is packed
// whole, the other block by block.
LOOM_BF16_TARGET void gemm_bf16_single(const Operand& a, const Operand& b, int64_t m, int64_t n, int64_t k, float alpha,
                                       float beta, float* c, int64_t ldc) {
  thread_local std::vector<std::uint32_t> whole;
  const int64_t k_pairs = (k + 1) / 2;
  if (m >= n) {
    const int64_t n_pad = round_up(n, kNr);
    whole.resize(static_cast<std::size_t>(n_pad * k_pairs));
    pack_b_full(b, 0, n, k, n_pad, whole.data());
    compute_with_packed_b(a, whole.data(), n_pad, 0, m, n, k, alpha, beta, c, ldc);
  } else {
    const int64_t m_pad = round_up(m, kMr);
    whole.resize(static_cast<std::size_t>(m_pad * k_pairs));
    pack_a_full(a, 0, m, k, m_pad, whole.data());
    compute_with_packed_a(whole.data(), packs_rows(a), m_pad, b, 0, n, m, k, alpha, beta, c, ldc);
  }
}

int64_t panel_start(int64_t n, int64_t i, int64_t p, int64_t align) {
  if (i >= p) return n;
  return std::min(n, (n * i / p + align / 2) / align * align);
}

}  // namespace

bool cpu_has_avx512_bf16() {
  return simd::cpu_has_avx512_bf16();
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
  // Panels of rows of C when m is the longer side, else of columns. The operand that is not cut
  // (the smaller one: at GPT-2's shapes the weights, or the activations of the output layer) is
  // packed whole once, by all threads together, into a buffer they share; each thread then packs
  // its panel of the other block by block. Every element of C is summed in the same order
  // whatever the panels, so results do not depend on the cut or the thread count.
  const bool by_rows = m >= n;
  const int64_t panels = std::min<int64_t>({ex_.num_threads(), (by_rows ? m / kPanelRows : n / kNr),
                                            work / std::max<int64_t>(1, options_.gemm_parallel_min_work)});
  if (panels < 2) {
    gemm_bf16_single(oa, ob, m, n, k, alpha, beta, c, ldc);
    return;
  }
  const int64_t k_pairs = (k + 1) / 2;
  const int64_t pad = by_rows ? round_up(n, kNr) : round_up(m, kMr);
  bf16_packed_.resize(static_cast<std::size_t>(pad * k_pairs));
  std::uint32_t* packed = bf16_packed_.data();
  ex_.parallel_for(panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      if (by_rows) {
        const int64_t s = panel_start(n, p, panels, kNr), e = panel_start(n, p + 1, panels, kNr);
        if (s < e) pack_b_full(ob, s, e, k, pad, packed);
      } else {
        const int64_t s = panel_start(m, p, panels, 8 * kMr), e = panel_start(m, p + 1, panels, 8 * kMr);
        if (s < e) pack_a_full(oa, s, e, k, pad, packed);
      }
    }
  });
  ex_.parallel_for(panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      if (by_rows) {
        const int64_t s = panel_start(m, p, panels, kPanelRows), e = panel_start(m, p + 1, panels, kPanelRows);
        if (s < e) compute_with_packed_b(oa, packed, pad, s, e, n, k, alpha, beta, c, ldc);
      } else {
        const int64_t s = panel_start(n, p, panels, kNr), e = panel_start(n, p + 1, panels, kNr);
        if (s < e) compute_with_packed_a(packed, packs_rows(oa), pad, ob, s, e, m, k, alpha, beta, c, ldc);
      }
    }
  });
}

}  // namespace loom::cpu
