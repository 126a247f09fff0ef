// backend/cuda: matrix products through cuBLASLt (gemm.hpp).
//
// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's first operand is
// B as stored (its column-major view is B^T) with B's transpose flag, the second A likewise, and
// the result C^T is n x m with leading dimension ldc. The bias of the epilogue (one per column of
// the row-major result) is then one per row of C^T, which is what CUBLASLT_EPILOGUE_BIAS adds.
#include "gemm.hpp"

#include <loom/error.hpp>
#include <map>
#include <string>
#include <tuple>

#include "kernels.hpp"

namespace loom::cuda {

namespace {

// The largest power of two (up to 256) dividing the address: what the heuristic may assume.
std::uint32_t alignment(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

using Key = std::tuple<bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                       std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, int, std::uint32_t, std::uint32_t,
                       std::uint32_t, std::uint32_t, bool>;

}  // namespace

struct Gemm::Plans {
  std::map<Key, Plan> plans;
};

Gemm::Gemm(Context& context) : context_(context), plans_(std::make_unique<Plans>()) {}

Gemm::~Gemm() {
  for (auto& [key, plan] : plans_->plans) {
    (void)cublasLtMatrixLayoutDestroy(plan.a);
    (void)cublasLtMatrixLayoutDestroy(plan.b);
    (void)cublasLtMatrixLayoutDestroy(plan.c);
    (void)cublasLtMatmulDescDestroy(plan.op);
  }
}

void Gemm::run(const GemmCall& g) {
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return;
  if (g.k <= 0) {
    // C = beta C (beta == 0: zeros, C not read), row by row of each matrix.
    for (std::int64_t i = 0; i < g.batch; ++i) {
      float* c = g.c + i * g.stride_c;
      if (g.beta == 0.0f)
        LOOM_CUDA_CHECK(cudaMemset2DAsync(c, sizeof(float) * static_cast<std::size_t>(g.ldc), 0,
                                          sizeof(float) * static_cast<std::size_t>(g.n), static_cast<std::size_t>(g.m),
                                          context_.stream));
      else
        for (std::int64_t r = 0; r < g.m; ++r)
          launch_scale(context_.stream, c + r * g.ldc, g.beta, c + r * g.ldc, g.n, false);
      if (g.bias) throw InternalError("backend cuda: a bias epilogue on a product with k == 0");
    }
    return;
  }
  const bool bf16 = g.precision == MatmulPrecision::bf16;
  // Operands as cuBLASLt reads them: the float32 arrays, or their bf16 copies.
  const std::int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const std::int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  std::unique_ptr<Context::Scratch> a16, b16;
  const void* a = g.a;
  const void* b = g.b;
  std::int64_t stride_a = g.stride_a, stride_b = g.stride_b;
  if (bf16) {
    // Each batch's matrix rounded into a dense (row stride ld) copy; batches back to back.
    const std::int64_t a_span = (a_rows - 1) * g.lda + a_cols, b_span = (b_rows - 1) * g.ldb + b_cols;
    const std::int64_t a_step = g.batch > 1 ? g.stride_a : a_span, b_step = g.batch > 1 ? g.stride_b : b_span;
    a16 = std::make_unique<Context::Scratch>(
        context_, sizeof(std::uint16_t) * static_cast<std::size_t>((g.batch - 1) * a_step + a_span));
    b16 = std::make_unique<Context::Scratch>(
        context_, sizeof(std::uint16_t) * static_cast<std::size_t>((g.batch - 1) * b_step + b_span));
    for (std::int64_t i = 0; i < g.batch; ++i) {
      launch_round_bf16(context_.stream, g.a + i * g.stride_a, a16->as<std::uint16_t>() + i * a_step, a_rows, a_cols,
                        g.lda);
      launch_round_bf16(context_.stream, g.b + i * g.stride_b, b16->as<std::uint16_t>() + i * b_step, b_rows, b_cols,
                        g.ldb);
    }
    a = a16->as<void>();
    b = b16->as<void>();
    stride_a = a_step;
    stride_b = b_step;
  }
  const std::uint32_t align_a = alignment(a), align_b = alignment(b), align_c = alignment(g.c),
                      align_bias = g.bias ? alignment(g.bias) : 256;
  const Key key{g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldc,
                stride_a,
                stride_b,
                g.stride_c,
                g.batch,
                g.bias != nullptr,
                static_cast<int>(g.precision),
                align_a,
                align_b,
                align_c,
                align_bias,
                g.beta != 0.0f};
  auto found = plans_->plans.find(key);
  if (found == plans_->plans.end()) {
    Plan p;
    const cublasComputeType_t compute =
        g.precision == MatmulPrecision::tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cudaDataType_t operand = bf16 ? CUDA_R_16BF : CUDA_R_32F;
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, compute, CUDA_R_32F));
    // cuBLASLt's A is our B, its B our A (the comment at the top).
    const cublasOperation_t op_first = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof op_first));
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof op_second));
    if (g.bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      const cudaDataType_t bias_type = CUDA_R_32F;
      LOOM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
      LOOM_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
    }
    // Column-major views: stored B is (col-major) b_cols x b_rows, stored A a_cols x a_rows.
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, operand, static_cast<std::uint64_t>(b_cols),
                                                 static_cast<std::uint64_t>(b_rows), g.ldb));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, operand, static_cast<std::uint64_t>(a_cols),
                                                 static_cast<std::uint64_t>(a_rows), g.lda));
    LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<std::uint64_t>(g.n),
                                                 static_cast<std::uint64_t>(g.m), g.ldc));
    if (g.batch > 1) {
      const auto batch = static_cast<std::int32_t>(g.batch);
      for (auto [layout, stride] : {std::pair{p.a, stride_b}, std::pair{p.b, stride_a}, std::pair{p.c, g.stride_c}}) {
        LOOM_CUBLAS_CHECK(
            cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
        LOOM_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                           sizeof stride));
      }
    }
    cublasLtMatmulPreference_t preference = nullptr;
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    const std::uint64_t workspace = context_.workspace_bytes;
    LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace, sizeof workspace));
    // cuBLASLt's A and B are our B and A.
    for (auto [attribute, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_b},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_a},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                                    std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}})
      LOOM_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof value));
    cublasLtMatmulHeuristicResult_t result{};
    int found_algos = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(context_.lt, p.op, p.a, p.b, p.c, p.c, preference, 1, &result, &found_algos);
    (void)cublasLtMatmulPreferenceDestroy(preference);
    if (status != CUBLAS_STATUS_SUCCESS || found_algos == 0) {
      (void)cublasLtMatrixLayoutDestroy(p.a);
      (void)cublasLtMatrixLayoutDestroy(p.b);
      (void)cublasLtMatrixLayoutDestroy(p.c);
      (void)cublasLtMatmulDescDestroy(p.op);
      throw InternalError("backend cuda: cuBLASLt has no algorithm for a " + std::to_string(g.m) + " x " +
                          std::to_string(g.n) + " x " + std::to_string(g.k) + " product (batch " +
                          std::to_string(g.batch) + ", lda " + std::to_string(g.lda) + ", ldb " +
                          std::to_string(g.ldb) + ", ldc " + std::to_string(g.ldc) +
                          "): " + cublasLtGetStatusString(status));
    }
    p.algo = result.algo;
    found = plans_->plans.emplace(key, p).first;
  }
  Plan& p = found->second;
  if (g.bias)
    LOOM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof g.bias));
  LOOM_CUBLAS_CHECK(cublasLtMatmul(context_.lt, p.op, &g.alpha, b, p.a, a, p.b, &g.beta, g.c, p.c, g.c, p.c, &p.algo,
                                   context_.workspace, context_.workspace_bytes, context_.stream));
}

}  // namespace loom::cuda
