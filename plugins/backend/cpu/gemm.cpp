// GEMMs: OpenBLAS, split into panels over the core's pool.
//
// OpenBLAS is held to one thread for the whole process (execution.hpp, "BLAS policy"). A GEMM
// large enough to be worth it is cut into one panel per thread, and each panel is one
// single-threaded sgemm. Panels are rows of C (a cut along m) unless m is too short: measured on
// GPT-2 shapes, row panels match or beat column panels, since each thread then streams the whole
// of B through its own packed copy of a block of A, the way OpenBLAS's own threading does.
//
// Thread-count independence: OpenBLAS's regular kernel sums each output element over k in the
// same order whatever the panel, but for small problems it switches to "small matrix" kernels
// that round differently (m*n*k up to about 1e6 on Skylake-X, about 2^21 with the Zen kernels
// of OpenBLAS 0.3.21). Panels are therefore never smaller than gemm_parallel_min_work (2^21 by
// default), so a problem is computed by the same kernel whether it is split or not. Within the
// regular kernel, an element's rounding also depends on the micro-tile that computes it: panel
// starts are multiples of the row tile of the kernels OpenBLAS chose at start-up (panel_rows():
// 12 for its Haswell and Zen kernels, 16 for Skylake-X, Cooper Lake and Sapphire Rapids, found by
// splitting GPT-2-sized products at every multiple of 4 and comparing bits; 48, a multiple of
// both, for any other), so the tiles of a panel are those of the unsplit product. The finest
// tile that is safe matters for speed: with 48-row starts a 256-row product (GPT-2 small at
// 4 x 64) splits 144/112 over two threads, 12% above an even split; with 12, 132/124. Products
// are never cut along n: on Zen 3 column panels changed results however they were aligned. GEMM
// results do not depend on the thread count (tests/numerics/cpu_backend_test.cpp checks it).
//
// With matmul_precision: bf16 (and auto, the default, on a CPU with AVX512-BF16) every product
// is a bf16 one instead (gemm_bf16.cpp), cut its own way (rows or columns, whichever is longer)
// and thread-count independent whatever the cut; the linear layer's epilogue then runs as a
// pass of its own after the product.
#include <cblas.h>

#include <cstring>

#include "cpu_backend.hpp"

// OpenBLAS's name for the kernels it chose (a weak reference: null with another BLAS).
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace loom::cpu {

namespace {

CBLAS_TRANSPOSE cblas_trans(bool t) {
  return t ? CblasTrans : CblasNoTrans;
}

// Row panels start at multiples of this (see the top of the file).
int64_t panel_rows() {
  static const int64_t rows = [] {
    const char* core = openblas_get_corename ? openblas_get_corename() : nullptr;
    if (!core) return int64_t{48};
    for (const char* name : {"Haswell", "Zen"})
      if (std::strcmp(core, name) == 0) return int64_t{12};
    for (const char* name : {"SkylakeX", "Cooperlake", "SapphireRapids"})
      if (std::strcmp(core, name) == 0) return int64_t{16};
    return int64_t{48};
  }();
  return rows;
}

// Start of panel i of p over [0, n), rounded to a multiple of `align`.
int64_t panel_start(int64_t n, int64_t i, int64_t p, int64_t align) {
  if (i >= p) return n;
  return std::min(n, (n * i / p + align / 2) / align * align);
}

}  // namespace

void CpuBackend::gemm_single(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                             int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  if (bf16_matmuls_) {
    gemm_bf16_on_thread(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, cblas_trans(ta), cblas_trans(tb), static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

CpuBackend::Split CpuBackend::gemm_split(int64_t m, int64_t n, int64_t k) const {
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  const int64_t panels = std::min<int64_t>(
      {ex_.num_threads(), m / panel_rows(), work / std::max<int64_t>(1, options_.gemm_parallel_min_work)});
  return {work < options_.gemm_parallel_min_work || panels < 2 ? 1 : panels};
}

void CpuBackend::gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // An empty product (k == 0: C scaled by beta) takes the float32 path below: gemm_bf16 hands
  // empty products back to gemm, which would come here again.
  if (bf16_matmuls_ && m > 0 && n > 0 && k > 0) {
    // The bf16 product has its own cut (rows or columns, gemm_bf16.cpp).
    gemm_bf16(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  const Split split = gemm_split(m, n, k);
  if (split.panels == 1) {
    gemm_single(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  ex_.parallel_for(split.panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t s = panel_start(m, p, split.panels, panel_rows()),
                    e = panel_start(m, p + 1, split.panels, panel_rows());
      if (s >= e) continue;
      gemm_single(ta, tb, e - s, n, k, alpha, ta ? a + s : a + s * lda, lda, b, ldb, beta, c + s * ldc, ldc);
    }
  });
}

void CpuBackend::linear_forward(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                                int64_t lda, const float* b, int64_t ldb, float* pre, const float* bias, float* out,
                                Activation act) {
  const Split split = gemm_split(m, n, k);
  const bool epilogue = bias || act != Activation::none;
  if (split.panels == 1 || !epilogue || bf16_matmuls_) {
    Backend::linear_forward(trans_a, trans_b, m, n, k, a, lda, b, ldb, pre, bias, out, act);
    return;
  }
  // Each thread applies the epilogue to its own rows of C right after computing them, while
  // they are still in cache.
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  ex_.parallel_for(split.panels, 1, [&](int64_t first, int64_t last) {
    for (int64_t p = first; p < last; ++p) {
      const int64_t s = panel_start(m, p, split.panels, panel_rows()),
                    e = panel_start(m, p + 1, split.panels, panel_rows());
      if (s >= e) continue;
      gemm_single(ta, tb, e - s, n, k, 1.0f, ta ? a + s : a + s * lda, lda, b, ldb, 0.0f, pre + s * n, n);
      bias_activation_rows(pre, bias, out, s, e, n, act);
    }
  });
}

void CpuBackend::gemm_batched(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                              const float* a, int64_t lda, int64_t stride_a, const float* b, int64_t ldb,
                              int64_t stride_b, float beta, float* c, int64_t ldc, int64_t stride_c, int64_t batch) {
  if (batch <= 0) return;
  const int64_t work = m * n * std::max<int64_t>(k, 1);
  if (batch == 1 || (work >= options_.gemm_parallel_min_work && batch < 2 * ex_.num_threads())) {
    // Few large products: split each one.
    for (int64_t i = 0; i < batch; ++i)
      gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
    return;
  }
  // Many products: one single-threaded GEMM per batch entry, batch entries in parallel.
  const bool ta = trans_a == Transpose::yes, tb = trans_b == Transpose::yes;
  const int64_t grain = std::max<int64_t>(1, options_.gemm_parallel_min_work / std::max<int64_t>(1, work));
  ex_.parallel_for(batch, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      gemm_single(ta, tb, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta, c + i * stride_c, ldc);
  });
}

}  // namespace loom::cpu
