// The flash kernel's bf16 tile products (compute = bf16): operands rounded to bfloat16
// (round-to-nearest-even, as VCVTNE2PS2BF16), products summed in float32 by VDPBF16PS. Compiled
// for AVX512-BF16 with function-level target attributes, so the plugin builds for any x86-64 CPU
// and takes this path only where cpu_supported() says so at run time.
//
// VDPBF16PS computes, per float32 lane j, acc[j] += a[2j] b[2j] + a[2j+1] b[2j+1]: the operands
// are therefore held as 32-bit words, each the bf16 pair (x[2p], x[2p+1]) of two consecutive k
// indices (the lower half is the even index). Three layouts cover every product of the kernel,
// all with zeros past the edges (an odd k's last pair, columns past n), so that padding adds 0:
//
//   rows         out[r * ld + p] = (x[r, 2p], x[r, 2p+1])   k along x's rows (Q, dO, P, dS as the
//                                                           left operand of Q K^T, P V, dO V^T, dS K)
//   column pairs out[p * width + r] = (x[r, 2p], x[r, 2p+1]) k along x's rows, n = x's rows (K and
//                                                           V as the right operand of Q K^T, dO V^T)
//   row pairs    out[p * width + c] = (x[2p, c], x[2p+1, c]) k down x's columns (V, K, Q, dO as the
//                                                           right operand of P V, dS K, dS^T Q, P^T
//                                                           dO; P and dS as the left of P^T dO, dS^T Q)
//
// `width` is a multiple of 16 (padded_width). product() takes its left operand as a word view
// A(r, p) = a[r * a_row + p * a_pair], so both the rows layout (a_row = ld, a_pair = 1) and the
// row-pairs layout read as a transposed left operand (a_row = 1, a_pair = width) serve.
#pragma once

#include <cstdint>

namespace loom::flash::bf16 {

using std::int64_t;
using std::uint32_t;

// AVX512-BF16 with AVX512-BW and -VL, asked of the running CPU.
bool cpu_supported();

inline int64_t padded_width(int64_t n) {
  return (n + 15) / 16 * 16;
}
inline int64_t pairs_of(int64_t n) {
  return (n + 1) / 2;
}

// Rows layout of the rows x k block x (row stride ldx): pairs_of(k) words per row, ld apart.
void pack_rows(const float* x, int64_t rows, int64_t k, int64_t ldx, uint32_t* out, int64_t ld);
// Column-pairs layout of the rows x k block x: pairs_of(k) groups of `width` words (>= rows).
void pack_column_pairs(const float* x, int64_t rows, int64_t k, int64_t ldx, uint32_t* out, int64_t width);
// Row-pairs layout of the rows x n block x: pairs_of(rows) groups of `width` words (>= n).
void pack_row_pairs(const float* x, int64_t rows, int64_t n, int64_t ldx, uint32_t* out, int64_t width);

// sum_i bf16(x_i) y_i in float32 (y not rounded).
float dot_rounded(const float* x, const float* y, int64_t n);

// C (m x n, row stride ldc) = alpha A B, or C += alpha A B when `accumulate`, over `pairs` word
// pairs: A(r, p) = a[r * a_row + p * a_pair], B(p, c) = b[p * b_pair + c] (b_pair >= padded
// width of n). Float32 accumulation in k order; results depend only on the operands.
void product(const uint32_t* a, int64_t a_row, int64_t a_pair, int64_t m, const uint32_t* b, int64_t b_pair, int64_t n,
             int64_t pairs, float alpha, bool accumulate, float* c, int64_t ldc);

}  // namespace loom::flash::bf16
