// Weights stored in fewer bits (Parameter::stored, lora.base_dtype): the product of an operand
// with a stored weight, a panel of the weight's rows at a time.
//
// Why panels of rows rather than a kernel of our own: each panel is dequantized (AVX-512 or AVX2
// kernels chosen at run time, quantization.hpp) into one reused buffer of at most 8 MiB and
// multiplied by the backend's own gemm (its bf16 or float32 kernels, its packing and threading),
// so a stored weight costs the dequantization of each value once per product on top of the
// float32 product, and never more memory than the panel. Rows of the weight are the unit because
// every codec reads a run of a row fastest (nf4's blocks of 64 run along rows).
#include <algorithm>

#include "loom/execution.hpp"
#include "numerics/ops_support.hpp"

namespace loom::detail {

namespace {

// Values per panel: 8 MiB of float32, enough that each panel's gemm splits over every thread.
constexpr std::int64_t panel_values = std::int64_t{1} << 21;

// Rows [r0, r0 + rows) of `w` into out (rows x w.cols), dequantized on every thread.
void dequantize_rows(const quant::StoredMatrix& w, std::int64_t r0, std::int64_t rows, float* out) {
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(1, w.cols));
  default_execution_context().parallel_for(rows, grain, [&](std::int64_t begin, std::int64_t end) {
    quant::dequantize(w, r0 + begin, end - begin, 0, w.cols, out + begin * w.cols, w.cols);
  });
}

}  // namespace

void stored_error(const Tensor& t, const char* op, const char* what) {
  const Parameter* p = t.parameter();
  op_error(op, std::string(what) + " is (a part of) parameter '" + p->name() + "', stored as " +
                   quant::storage_format_name(p->stored()->format) +
                   " (lora.base_dtype): only linear, linear_cross_entropy and embedding take a stored weight, whole");
}

const quant::StoredMatrix* stored_weight(const Ops& ops, const Tensor& t, const char* op, const char* what) {
  const Parameter* p = t.defined() ? t.parameter() : nullptr;
  if (!p || !p->stored()) return nullptr;
  if (!(t.shape() == p->shape()) || t.offset() != p->tensor().offset() || !t.is_contiguous()) stored_error(t, op, what);
  if (!ops.buffer_type().device().is_host())
    op_error(op, std::string(what) + " '" + p->name() + "' is stored in fewer bits, which backend '" +
                     std::string(ops.backend().name()) + "' (on " + ops.buffer_type().device().str() +
                     ") does not read; stored weights need a host backend");
  return p->stored();
}

void gemm_weight(Backend& backend, const quant::StoredMatrix* stored, const float* w, std::int64_t ldw,
                 bool transpose_w, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 float beta, float* c, std::int64_t ldc) {
  if (!stored) {
    backend.gemm(Transpose::no, transpose_w ? Transpose::yes : Transpose::no, m, n, k, 1.0f, a, lda, w, ldw, beta, c,
                 ldc);
    return;
  }
  const std::int64_t rows = stored->rows, cols = stored->cols;
  if (transpose_w ? (rows != n || cols != k) : (rows != k || cols != n))
    op_error("linear", "a stored [" + std::to_string(rows) + ", " + std::to_string(cols) + "] weight in a product of " +
                           std::to_string(m) + " x " + std::to_string(k) + " by " + std::to_string(k) + " x " +
                           std::to_string(n));
  if (m <= 0 || n <= 0) return;
  std::int64_t panel = std::max<std::int64_t>(1, panel_values / std::max<std::int64_t>(1, cols));
  if (panel > 16) panel = panel / 16 * 16;
  panel = std::min(panel, rows);
  if (rows == 0) {  // k == 0 (transpose_w is then false): C = beta C
    backend.gemm(Transpose::no, Transpose::no, m, n, 0, 1.0f, a, lda, nullptr, n, beta, c, ldc);
    return;
  }
  Tensor buffer = Tensor::empty(Shape{panel, cols});
  float* p = buffer.data<float>();
  for (std::int64_t r0 = 0; r0 < rows; r0 += panel) {
    const std::int64_t nr = std::min(panel, rows - r0);
    dequantize_rows(*stored, r0, nr, p);
    if (transpose_w)  // C[:, r0 .. r0 + nr) = A P^T: the panel is output features
      backend.gemm(Transpose::no, Transpose::yes, m, nr, k, 1.0f, a, lda, p, cols, beta, c + r0, ldc);
    else  // C += A[:, r0 .. r0 + nr) P: the panel is a range of the inner dimension
      backend.gemm(Transpose::no, Transpose::no, m, n, nr, 1.0f, a + r0, lda, p, cols, r0 == 0 ? beta : 1.0f, c, ldc);
  }
}

}  // namespace loom::detail
