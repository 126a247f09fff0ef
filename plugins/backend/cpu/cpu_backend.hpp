// backend/cpu: the fast CPU backend. OpenBLAS for every GEMM (split into panels over the core's
// pool, one single-threaded BLAS call per panel), 16-float vector kernels parallelised through
// the ExecutionContext for everything else, fused passes where they save memory traffic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <loom/execution.hpp>
#include <loom/kinds/backend.hpp>
#include <vector>

namespace loom::cpu {

using std::int64_t;

struct CpuOptions {
  // GEMMs with m * n * k below this run as one BLAS call on the calling thread.
  int64_t gemm_parallel_min_work = int64_t{1} << 21;
  // Elements per chunk of the elementwise kernels (a parallel loop smaller than this runs
  // inline, with no synchronisation).
  int64_t grain = 16384;
  // Mixed precision (option matmul_precision: bf16, or auto on a CPU with AVX512-BF16): every
  // float32 GEMM of this backend (gemm, gemm_batched, linear_forward: every matrix product of
  // the operations; the attention kernels call BLAS themselves) rounds its operands to bf16 and
  // accumulates in float32, as gemm_bf16 does. Only where the CPU has AVX512-BF16; elsewhere the
  // products stay float32 (the factory warns when bf16 was asked for explicitly).
  bool bf16_matmuls = false;
};

// The bias + activation epilogue on rows [r0, r1) of a rows x cols matrix, on the calling
// thread (pointwise.cpp): what bias_activation_forward runs per chunk.
void bias_activation_rows(float* pre, const float* bias, float* out, int64_t r0, int64_t r1, int64_t cols,
                          Activation act);

// Whether this CPU has the AVX512-BF16 instructions the bf16 GEMM uses (gemm_bf16.cpp).
bool cpu_has_avx512_bf16();
// gemm_bf16 on the calling thread (m, n, k > 0), on a CPU where cpu_has_avx512_bf16().
void gemm_bf16_on_thread(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                         const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

class CpuBackend final : public Backend {
 public:
  CpuBackend(ExecutionContext& execution, const CpuOptions& options)
      : ex_(execution),
        options_(options),
        has_bf16_(cpu_has_avx512_bf16()),
        bf16_matmuls_(options.bf16_matmuls && has_bf16_) {}

  std::string_view name() const override { return "cpu"; }
  // Every group on f32; GEMMs on bf16 too where the CPU has AVX512-BF16 (gemm_bf16.cpp).
  bool supports_op(BackendOp op, DType dtype) const override {
    return dtype == DType::f32 || (dtype == DType::bf16 && op == BackendOp::gemm && has_bf16_);
  }
  DType matmul_dtype() const override { return bf16_matmuls_ ? DType::bf16 : DType::f32; }

  void gemm(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
            int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override;
  void gemm_batched(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                    int64_t ldc, int64_t stride_c, int64_t batch) override;
  // AVX512-BF16 where the CPU has it (gemm_bf16.cpp), else Backend's default (rounded copies,
  // float32 sgemm).
  void gemm_bf16(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                 int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) override;

  void linear_forward(Transpose trans_a, Transpose trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                      int64_t lda, const float* b, int64_t ldb, float* pre, const float* bias, float* out,
                      Activation act) override;
  void bias_activation_forward(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                               Activation act) override;
  void bias_activation_backward(const float* pre, const float* dout, float* dpre, float* dbias, bool accumulate_dbias,
                                int64_t rows, int64_t cols, Activation act) override;

  void activation_forward(Activation act, const float* x, float* y, int64_t n) override;
  void activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n,
                           bool accumulate) override;
  void swiglu_forward(const float* gate, const float* up, float* y, int64_t n) override;
  void swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate, bool accumulate_dgate,
                       float* dup, bool accumulate_dup, int64_t n) override;
  void add(const float* a, const float* b, float* y, int64_t n) override;
  void scale(const float* x, float alpha, float* y, int64_t n, bool accumulate) override;
  void fill(float* y, float value, int64_t n) override;
  void dropout(const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate) override;

  void layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean, float* rstd,
                          int64_t rows, int64_t cols, float eps) override;
  void layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd, const float* dy,
                           float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight, float* dbias,
                           bool accumulate_dbias, int64_t rows, int64_t cols) override;
  void add_layer_norm_forward(const float* a, const float* b, float* sum, const float* weight, const float* bias,
                              float* y, float* mean, float* rstd, int64_t rows, int64_t cols, float eps) override;
  void rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows, int64_t cols,
                        float eps) override;
  void rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                         bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                         int64_t cols) override;
  void add_rms_norm_forward(const float* a, const float* b, float* sum, const float* weight, float* y, float* rstd,
                            int64_t rows, int64_t cols, float eps) override;

  void embedding_forward(const float* table, const std::int32_t* ids, float* out, int64_t n, int64_t dim,
                         int64_t vocab) override;
  void embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                          int64_t vocab) override;
  void rope(const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y, int64_t y_batch_stride,
            int64_t y_token_stride, const float* cos, const float* sin, const std::int32_t* positions,
            int64_t position_offset, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim, bool interleaved,
            bool inverse, bool accumulate) override;

  void cross_entropy_forward(const float* logits, int64_t ld, const std::int32_t* targets, float* losses, float* lse,
                             int64_t rows, int64_t vocab, std::int32_t ignore_index) override;
  void cross_entropy_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse,
                              float grad_scale, int64_t rows, int64_t vocab, std::int32_t ignore_index) override;
  // exact_ops.cpp: the core's former host loops, unchanged in their arithmetic, in parallel.
  void mul(const float* a, const float* b, float* y, int64_t n, bool accumulate) override;
  void softcap_forward(const float* x, float* y, float* tanh_out, int64_t n, float cap) override;
  void softcap_backward(const float* h, float h_scale, const float* dy, float* dx, int64_t n, bool accumulate) override;
  void softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) override;
  void softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                        bool accumulate) override;
  void logsumexp_forward(const float* x, float* y, int64_t rows, int64_t cols) override;
  void logsumexp_backward(const float* x, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                          bool accumulate) override;
  void sum_forward(const float* x, float* y, int64_t n) override;
  void sum_backward(const float* dy, float* dx, int64_t n, bool accumulate) override;
  void loss_reduce(const float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                   std::int32_t ignore_index, float scale, float z_loss_weight, float* out) override;
  void z_loss_forward(float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                      std::int32_t ignore_index, float z_loss_weight) override;
  void z_loss_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse, float grad_scale,
                       float z_loss_weight, int64_t rows, int64_t vocab, std::int32_t ignore_index) override;

 private:
  // Rows per chunk of a row-wise reduction: a function of cols only, so that per-chunk partial
  // sums, and therefore results, do not depend on the thread count.
  static int64_t rows_per_chunk(int64_t cols) {
    return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, cols));
  }
  // Rows per parallel chunk of a row-wise kernel without cross-row reductions.
  int64_t row_grain(int64_t cols) const { return std::max<int64_t>(1, options_.grain / std::max<int64_t>(1, cols)); }
  // A scratch buffer of at least n floats, kept between calls (the backend is used by one
  // thread at a time).
  float* scratch(std::size_t n) {
    if (scratch_.size() < n) scratch_.resize(n);
    return scratch_.data();
  }
  // out[j] (+)= sum over c < chunks, in chunk order, of partials[c * stride + j], for j < cols.
  void reduce_partials(const float* partials, int64_t chunks, int64_t stride, int64_t cols, float* out,
                       bool accumulate);
  // How a GEMM is cut: `panels` (1: not at all) of rows of C.
  struct Split {
    int64_t panels;
  };
  Split gemm_split(int64_t m, int64_t n, int64_t k) const;
  void gemm_single(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                   const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

  ExecutionContext& ex_;
  CpuOptions options_;
  bool has_bf16_;
  bool bf16_matmuls_;  // options_.bf16_matmuls, where the CPU can
  std::vector<float> scratch_;
  std::vector<std::uint32_t> bf16_packed_;  // gemm_bf16's operand packed whole, shared by the threads
};

}  // namespace loom::cpu
