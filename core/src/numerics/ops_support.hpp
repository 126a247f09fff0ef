// Core-internal helpers shared by the operations: argument checks (dtype, device, backend
// support), allocation in the backend's memory, and matrix views.
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

[[noreturn]] inline void device_error(const Ops& ops, const Tensor& t, const char* op, const char* what) {
  op_error(op, std::string(what) + " " + t.str() + " is on " + t.device().str() + ", but backend '" +
                   std::string(ops.backend().name()) + "' computes on " + ops.buffer_type().device().str() +
                   "; copy it there explicitly (Tensor::to) first");
}

// Every tensor an operation takes is in the memory its backend computes in.
inline void require_device(const Ops& ops, const Tensor& t, const char* op, const char* what) {
  if (t.defined() && &t.buffer_type() != &ops.buffer_type()) device_error(ops, t, op, what);
}

// The operation needs the backend's kernel group `kernels` on `dtype` data.
inline void require_op(const Ops& ops, BackendOp kernels, DType dtype, const char* op) {
  if (ops.backend().supports_op(kernels, dtype)) return;
  throw UserError(std::string(op) + ": backend '" + std::string(ops.backend().name()) + "' does not support " +
                  std::string(dtype_name(dtype)) + " data in its " + std::string(backend_op_name(kernels)) +
                  " kernels; choose a backend that does");
}

[[noreturn]] void stored_error(const Tensor& t, const char* op, const char* what);

inline void require_f32(const Ops& ops, const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) op_error(op, std::string(what) + " is undefined");
  if (t.dtype() != DType::f32) op_error(op, std::string(what) + " must be f32, not " + t.str());
  if (const Parameter* p = t.parameter(); p && p->stored()) stored_error(t, op, what);
  require_device(ops, t, op, what);
}

// The stored form of `t` (Parameter::stored) when t is the whole of a parameter stored in fewer
// bits; null for a tensor whose value is its data. A part of a stored parameter (a slice) is an
// InternalError: only whole weights are stored. The operations that take stored weights
// (linear, linear_cross_entropy, embedding) need host memory.
const quant::StoredMatrix* stored_weight(const Ops& ops, const Tensor& t, const char* op, const char* what);

// C[m, n] = A[m, k] op(W) + beta C, W either a float32 matrix (w, ldw) or `stored`:
// transpose_w: W is [n, k] (C = A W^T), else [k, n]. With a stored W, panels of its rows are
// dequantized into a buffer of a few MiB, one after another, and each is one backend gemm: never
// a float32 copy of the whole weight.
void gemm_weight(Backend& backend, const quant::StoredMatrix* stored, const float* w, std::int64_t ldw,
                 bool transpose_w, std::int64_t m, std::int64_t n, std::int64_t k, const float* a, std::int64_t lda,
                 float beta, float* c, std::int64_t ldc);

inline void require_i32(const Ops& ops, const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) op_error(op, std::string(what) + " is undefined");
  if (t.dtype() != DType::i32) op_error(op, std::string(what) + " must be i32, not " + t.str());
  if (!t.is_contiguous()) op_error(op, std::string(what) + " must be contiguous");
  require_device(ops, t, op, what);
}

inline void require_same_shape(const Tensor& a, const Tensor& b, const char* op, const char* what_a,
                               const char* what_b) {
  if (!(a.shape() == b.shape()))
    op_error(op, std::string(what_a) + " " + a.shape().str() + " and " + what_b + " " + b.shape().str() +
                     " must have the same shape");
}

// An optional per-feature vector (a norm's weight, a bias): undefined, or contiguous f32 [n].
inline void require_vector(const Ops& ops, const Tensor& t, std::int64_t n, const char* op, const char* what) {
  if (!t.defined()) return;
  require_f32(ops, t, op, what);
  if (t.rank() != 1 || t.size(0) != n || !t.is_contiguous())
    op_error(op, std::string(what) + " must be a contiguous [" + std::to_string(n) + "], not " + t.str());
}

// A new contiguous f32 tensor in the backend's memory.
inline Tensor empty(const Ops& ops, const Shape& shape) {
  return Tensor::empty(shape, DType::f32, ops.buffer_type());
}
inline Tensor empty(BufferType& type, const Shape& shape) {
  return Tensor::empty(shape, DType::f32, type);
}

// A one-element f32 tensor holding `value` in `type`'s memory.
inline Tensor scalar(BufferType& type, float value) {
  if (&type == &host_buffer_type()) return Tensor::scalar(value);
  Tensor t = Tensor::empty(Shape{}, DType::f32, type);
  t.copy_from(Tensor::scalar(value));
  return t;
}

// `t` where host code can read it: t itself in host-visible memory, else a host copy. For the
// checks the core makes on ids and targets, and for the reductions it does on the host.
inline Tensor host_readable(const Tensor& t) {
  return t.is_host_visible() ? t : t.to(Device::host());
}

// Kernel arguments: addresses in the tensor's own memory (device addresses on a device).
inline float* ptr(const Tensor& t) {
  return t.device_data<float>();
}
inline const std::int32_t* ids_ptr(const Tensor& t) {
  return t.defined() ? t.device_data<std::int32_t>() : nullptr;
}
inline const float* data_or_null(const Tensor& t) {
  return t.defined() ? t.device_data<float>() : nullptr;
}

// A tensor seen as rows x cols with row stride ld (Tensor::is_row_strided).
struct Matrix {
  float* data;
  std::int64_t rows, cols, ld;
};

inline Matrix as_matrix(const Tensor& t) {
  std::int64_t ld = 0;
  t.is_row_strided(&ld);
  return {t.device_data<float>(), t.shape().rows(), t.rank() ? t.shape().back() : 1, ld};
}

// Gradient destinations of one node, resolved at backward time.
inline float* grad_data(const BackwardPass::Buffer& b) {
  return b.tensor.defined() ? b.tensor.device_data<float>() : nullptr;
}

}  // namespace loom::detail
