// backend/cuda: matrix products through cuBLASLt (gemm.cpp).
#pragma once

#include <cstdint>
#include <memory>

#include "context.hpp"
#include "cuda_options.hpp"

namespace loom::cuda {

// One product C = alpha op(A) op(B) + beta C, row-major with BLAS semantics (kinds/backend.hpp's
// gemm), `batch` of them at the given strides, in `precision`:
//   f32  : CUBLAS_COMPUTE_32F (float32 exactly: no TF32);
//   tf32 : CUBLAS_COMPUTE_32F_FAST_TF32;
//   bf16 : A and B rounded to bfloat16 (nearest even, as to_bfloat16) into scratch, float32
//          accumulation and output: gemm_bf16's product.
// `bias` (nullable, n floats) is added to every row of the result by cuBLASLt's epilogue
// (linear_forward's). Requires beta == 0 with a bias. The plans (layouts and the heuristic's
// algorithm) are cached per shape, alignment and precision.
struct GemmCall {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const float* a = nullptr;
  std::int64_t lda = 0, stride_a = 0;
  const float* b = nullptr;
  std::int64_t ldb = 0, stride_b = 0;
  float* c = nullptr;
  std::int64_t ldc = 0, stride_c = 0;
  std::int64_t batch = 1;
  const float* bias = nullptr;
  MatmulPrecision precision = MatmulPrecision::f32;
};

class Gemm {
 public:
  explicit Gemm(Context& context);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  void run(const GemmCall& call);

 private:
  struct Plans;
  Context& context_;
  std::unique_ptr<Plans> plans_;
};

}  // namespace loom::cuda
