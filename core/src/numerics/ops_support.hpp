// Core-internal helpers shared by the operations: argument checks and matrix views.
#pragma once

#include <cstdint>
#include <string>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "numerics/tape.hpp"

namespace loom::detail {

[[noreturn]] inline void op_error(const char* op, const std::string& message) {
  throw InternalError(std::string(op) + ": " + message);
}

inline void require_f32(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) op_error(op, std::string(what) + " is undefined");
  if (t.dtype() != DType::f32) op_error(op, std::string(what) + " must be f32, not " + t.str());
}

inline void require_i32(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) op_error(op, std::string(what) + " is undefined");
  if (t.dtype() != DType::i32) op_error(op, std::string(what) + " must be i32, not " + t.str());
  if (!t.is_contiguous()) op_error(op, std::string(what) + " must be contiguous");
}

inline void require_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                               const char* what_b) {
  if (!(a.shape() == b.shape()))
    op_error(op, std::string(what_a) + " " + a.shape().str() + " and " + what_b + " " + b.shape().str() +
                     " must have the same shape");
}

// An optional per-feature vector (a norm's weight, a bias): undefined, or contiguous f32 [n].
inline void require_vector(const Tensor& t, std::int64_t n, const char* op, const char* what) {
  if (!t.defined()) return;
  require_f32(t, op, what);
  if (t.rank() != 1 || t.size(0) != n || !t.is_contiguous())
    op_error(op, std::string(what) + " must be a contiguous [" + std::to_string(n) + "], not " + t.str());
}

inline const float* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<float>() : nullptr;
}

// A tensor seen as rows x cols with row stride ld (Tensor::is_row_strided).
struct Matrix {
  float* data;
  std::int64_t rows, cols, ld;
};

inline Matrix as_matrix(const Tensor& t) {
  std::int64_t ld = 0;
  t.is_row_strided(&ld);
  return {t.data<float>(), t.shape().rows(), t.rank() ? t.shape().back() : 1, ld};
}

// Gradient destinations of one node, resolved at backward time.
inline float* grad_data(const BackwardPass::Buffer& b) {
  return b.tensor.defined() ? b.tensor.data<float>() : nullptr;
}

}  // namespace loom::detail
