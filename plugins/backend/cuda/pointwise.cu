// backend/cuda: the elementwise kernels (fill, scale, add, mul, activations, SwiGLU, the linear
// layer's bias and activation epilogue, dropout, soft-capping, the bf16 rounding of gemm_bf16).
// Per element the arithmetic of kernel_math.hpp (reference's, in float64).
#include <loom/random.hpp>

#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

__global__ void fill_kernel(float* y, float value, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = value;
}
__global__ void scale_kernel(const float* x, float alpha, float* y, std::int64_t n, bool accumulate) {
  LOOM_GRID_STRIDE(i, n) math::store(y, i, static_cast<double>(alpha) * x[i], accumulate);
}
__global__ void add_kernel(const float* a, const float* b, float* y, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = static_cast<float>(static_cast<double>(a[i]) + b[i]);
}
__global__ void mul_kernel(const float* a, const float* b, float* y, std::int64_t n, bool accumulate) {
  LOOM_GRID_STRIDE(i, n) math::store(y, i, static_cast<double>(a[i]) * b[i], accumulate);
}
__global__ void activation_forward_kernel(int act, const float* x, float* y, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = static_cast<float>(math::act_value(act, x[i]));
}
__global__ void activation_backward_kernel(int act, const float* x, const float* dy, float* dx, std::int64_t n,
                                           bool accumulate) {
  LOOM_GRID_STRIDE(i, n) math::store(dx, i, static_cast<double>(dy[i]) * math::act_derivative(act, x[i]), accumulate);
}
__global__ void swiglu_forward_kernel(const float* gate, const float* up, float* y, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) y[i] = static_cast<float>(math::swiglu_value(gate[i], up[i]));
}
__global__ void swiglu_backward_kernel(const float* gate, const float* up, const float* dy, float* dgate,
                                       bool accumulate_dgate, float* dup, bool accumulate_dup, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) {
    const double g = gate[i], u = up[i], d = dy[i];
    if (dgate) math::store(dgate, i, math::swiglu_dgate(g, u, d), accumulate_dgate);
    if (dup) math::store(dup, i, math::swiglu_dup(g, d), accumulate_dup);
  }
}
__global__ void bias_activation_forward_kernel(float* pre, const float* bias, float* out, std::int64_t rows,
                                               std::int64_t cols, int act) {
  LOOM_GRID_STRIDE(i, rows * cols) {
    float p = pre[i];
    if (bias) {
      p = static_cast<float>(static_cast<double>(p) + bias[i % cols]);
      pre[i] = p;
    }
    if (act != math::act_none) out[i] = static_cast<float>(math::act_value(act, p));
  }
}
// One thread per column: dpre's column sum over the rows in row order (float64), so dbias does
// not depend on the launch shape.
__global__ void bias_activation_backward_kernel(const float* pre, const float* dout, float* dpre, float* dbias,
                                                bool accumulate_dbias, std::int64_t rows, std::int64_t cols, int act) {
  LOOM_GRID_STRIDE(j, cols) {
    double sum = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const std::int64_t i = r * cols + j;
      const double d = act == math::act_none ? static_cast<double>(dout[i])
                                             : static_cast<double>(dout[i]) * math::act_derivative(act, pre[i]);
      if (act != math::act_none || dpre != dout) dpre[i] = static_cast<float>(d);
      sum += d;
    }
    if (dbias) math::store(dbias, j, sum, accumulate_dbias);
  }
}
__global__ void dropout_kernel(const float* x, float* y, std::int64_t n, std::uint32_t threshold, float scale,
                               std::uint64_t key, bool accumulate) {
  LOOM_GRID_STRIDE(i, n) {
    const bool keep = dropout_keep(key, static_cast<std::uint32_t>(i), threshold);
    math::store(y, i, math::dropout_value(x[i], keep, scale), accumulate);
  }
}
__global__ void softcap_forward_kernel(const float* x, float* y, float* tanh_out, std::int64_t n, float cap) {
  LOOM_GRID_STRIDE(i, n) {
    const double h = math::softcap_tanh(x[i], cap);
    y[i] = static_cast<float>(cap * h);
    if (tanh_out) tanh_out[i] = static_cast<float>(h);
  }
}
__global__ void softcap_backward_kernel(const float* h, float h_scale, const float* dy, float* dx, std::int64_t n,
                                        bool accumulate) {
  LOOM_GRID_STRIDE(i, n) math::store(dx, i, math::softcap_grad(h[i], h_scale, dy[i]), accumulate);
}
// Nearest, ties to even (tensor.hpp's to_bfloat16): NaN stays a quiet NaN.
__device__ inline std::uint16_t bf16_bits(float f) {
  const std::uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
__global__ void round_bf16_kernel(const float* x, std::uint16_t* y, std::int64_t rows, std::int64_t cols,
                                  std::int64_t ld) {
  LOOM_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols, j = i % cols;
    y[r * ld + j] = bf16_bits(x[r * ld + j]);
  }
}

}  // namespace

#define LOOM_LAUNCH(kernel, n, ...)                                     \
  do {                                                                  \
    if ((n) <= 0) return;                                               \
    kernel<<<blocks_for((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__); \
    LOOM_CHECK_LAUNCH(#kernel);                                         \
  } while (0)

void launch_fill(cudaStream_t s, float* y, float value, int64_t n) {
  LOOM_LAUNCH(fill_kernel, n, y, value, n);
}
void launch_scale(cudaStream_t s, const float* x, float alpha, float* y, int64_t n, bool accumulate) {
  LOOM_LAUNCH(scale_kernel, n, x, alpha, y, n, accumulate);
}
void launch_add(cudaStream_t s, const float* a, const float* b, float* y, int64_t n) {
  LOOM_LAUNCH(add_kernel, n, a, b, y, n);
}
void launch_mul(cudaStream_t s, const float* a, const float* b, float* y, int64_t n, bool accumulate) {
  LOOM_LAUNCH(mul_kernel, n, a, b, y, n, accumulate);
}
void launch_activation_forward(cudaStream_t s, int act, const float* x, float* y, int64_t n) {
  LOOM_LAUNCH(activation_forward_kernel, n, act, x, y, n);
}
void launch_activation_backward(cudaStream_t s, int act, const float* x, const float* dy, float* dx, int64_t n,
                                bool accumulate) {
  LOOM_LAUNCH(activation_backward_kernel, n, act, x, dy, dx, n, accumulate);
}
void launch_swiglu_forward(cudaStream_t s, const float* gate, const float* up, float* y, int64_t n) {
  LOOM_LAUNCH(swiglu_forward_kernel, n, gate, up, y, n);
}
void launch_swiglu_backward(cudaStream_t s, const float* gate, const float* up, const float* dy, float* dgate,
                            bool accumulate_dgate, float* dup, bool accumulate_dup, int64_t n) {
  LOOM_LAUNCH(swiglu_backward_kernel, n, gate, up, dy, dgate, accumulate_dgate, dup, accumulate_dup, n);
}
void launch_bias_activation_forward(cudaStream_t s, float* pre, const float* bias, float* out, int64_t rows,
                                    int64_t cols, int act) {
  LOOM_LAUNCH(bias_activation_forward_kernel, rows * cols, pre, bias, out, rows, cols, act);
}
void launch_bias_activation_backward(cudaStream_t s, const float* pre, const float* dout, float* dpre, float* dbias,
                                     bool accumulate_dbias, int64_t rows, int64_t cols, int act) {
  if (rows <= 0) {
    // No rows: dbias (+)= 0.
    if (dbias && !accumulate_dbias) launch_fill(s, dbias, 0.0f, cols);
    return;
  }
  LOOM_LAUNCH(bias_activation_backward_kernel, cols, pre, dout, dpre, dbias, accumulate_dbias, rows, cols, act);
}
void launch_dropout(cudaStream_t s, const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate) {
  LOOM_LAUNCH(dropout_kernel, n, x, y, n, dropout_threshold(p), dropout_scale(p), key, accumulate);
}
void launch_softcap_forward(cudaStream_t s, const float* x, float* y, float* tanh_out, int64_t n, float cap) {
  LOOM_LAUNCH(softcap_forward_kernel, n, x, y, tanh_out, n, cap);
}
void launch_softcap_backward(cudaStream_t s, const float* h, float h_scale, const float* dy, float* dx, int64_t n,
                             bool accumulate) {
  LOOM_LAUNCH(softcap_backward_kernel, n, h, h_scale, dy, dx, n, accumulate);
}
void launch_round_bf16(cudaStream_t s, const float* x, std::uint16_t* y, int64_t rows, int64_t cols, int64_t ld) {
  LOOM_LAUNCH(round_bf16_kernel, rows * cols, x, y, rows, cols, ld);
}

}  // namespace loom::cuda
