// backend/cuda: cross-entropy, softmax, log-sum-exp, the sum, the losses' reductions and z-loss.
// Row statistics by one block per row (float64 block sums in a fixed tree order); the whole-array
// reductions (sum, loss_reduce) by one block, each thread summing a contiguous stretch in index
// order and the stretches combined by the fixed tree: deterministic.
#include <limits>

#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

// The row's max and sum of exp(x - max), in double, every thread of the block getting them.
__device__ inline void max_and_exp_sum(const float* xr, std::int64_t cols, double* shared, double& mx, double& sum) {
  double part = -INFINITY;
  for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) part = fmax(part, static_cast<double>(xr[j]));
  mx = block_max(part, shared);
  part = 0.0;
  for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) part += exp(xr[j] - mx);
  sum = block_sum(part, shared);
}

__global__ void cross_entropy_forward_kernel(const float* logits, std::int64_t ld, const std::int32_t* targets,
                                             float* losses, float* lse, std::int64_t rows, std::int64_t vocab,
                                             std::int32_t ignore_index) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* l = logits + r * ld;
    double mx, sum;
    max_and_exp_sum(l, vocab, shared, mx, sum);
    if (threadIdx.x == 0) {
      const double z = mx + log(sum);
      lse[r] = static_cast<float>(z);
      losses[r] = targets[r] == ignore_index ? 0.0f : static_cast<float>(z - l[targets[r]]);
    }
  }
}

__global__ void cross_entropy_backward_kernel(float* logits, std::int64_t ld, const std::int32_t* targets,
                                              const float* lse, float grad_scale, std::int64_t rows, std::int64_t vocab,
                                              std::int32_t ignore_index) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    float* l = logits + r * ld;
    const bool ignored = targets[r] == ignore_index;
    for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      if (ignored) {
        l[j] = 0.0f;
        continue;
      }
      const double p = exp(static_cast<double>(l[j]) - lse[r]);
      l[j] = static_cast<float>(grad_scale * (p - (j == targets[r] ? 1.0 : 0.0)));
    }
  }
}

__global__ void softmax_forward_kernel(const float* x, float* y, std::int64_t rows, std::int64_t cols) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    double mx, sum;
    max_and_exp_sum(xr, cols, shared, mx, sum);
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads)
      y[r * cols + j] = static_cast<float>(exp(xr[j] - mx) / sum);
  }
}

__global__ void softmax_backward_kernel(const float* y, const float* dy, float* dx, std::int64_t rows,
                                        std::int64_t cols, bool accumulate) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double part = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads)
      part += static_cast<double>(dy[r * cols + j]) * y[r * cols + j];
    const double dot = block_sum(part, shared);
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const std::int64_t i = r * cols + j;
      math::store(dx, i, static_cast<double>(y[i]) * (dy[i] - dot), accumulate);
    }
  }
}

__global__ void logsumexp_forward_kernel(const float* x, float* y, std::int64_t rows, std::int64_t cols) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    double mx, sum;
    max_and_exp_sum(x + r * cols, cols, shared, mx, sum);
    if (threadIdx.x == 0) y[r] = static_cast<float>(mx + log(sum));
  }
}

__global__ void logsumexp_backward_kernel(const float* x, const float* y, const float* dy, float* dx, std::int64_t rows,
                                          std::int64_t cols, bool accumulate) {
  LOOM_GRID_STRIDE(i, rows * cols) {
    const std::int64_t r = i / cols;
    math::store(dx, i, static_cast<double>(dy[r]) * exp(static_cast<double>(x[i]) - y[r]), accumulate);
  }
}

// One block: thread t sums its contiguous stretch [t n / T, (t + 1) n / T) in order.
__global__ void sum_forward_kernel(const float* x, float* y, std::int64_t n) {
  __shared__ double shared[kThreads];
  const std::int64_t begin = n * threadIdx.x / kThreads, end = n * (threadIdx.x + 1) / kThreads;
  double part = 0.0;
  for (std::int64_t i = begin; i < end; ++i) part += x[i];
  const double total = block_sum(part, shared);
  if (threadIdx.x == 0) y[0] = static_cast<float>(total);
}

__global__ void sum_backward_kernel(const float* dy, float* dx, std::int64_t n, bool accumulate) {
  LOOM_GRID_STRIDE(i, n) math::store(dx, i, dy[0], accumulate);
}

__global__ void loss_reduce_kernel(const float* losses, const float* lse, const std::int32_t* targets,
                                   std::int64_t rows, std::int32_t ignore_index, float scale, float z_loss_weight,
                                   float* out) {
  __shared__ double shared[kThreads];
  const std::int64_t begin = rows * threadIdx.x / kThreads, end = rows * (threadIdx.x + 1) / kThreads;
  double s = 0.0, z = 0.0;
  for (std::int64_t r = begin; r < end; ++r) {
    s += losses[r];
    if (targets[r] != ignore_index) z += static_cast<double>(lse[r]) * lse[r];
  }
  const double total = block_sum(s, shared);
  const double total_z = block_sum(z, shared);
  if (threadIdx.x == 0) {
    float value = static_cast<float>(total * scale);
    if (z_loss_weight != 0.0f) value += static_cast<float>(z_loss_weight * total_z * scale);
    out[0] = value;
  }
}

__global__ void z_loss_forward_kernel(float* losses, const float* lse, const std::int32_t* targets, std::int64_t rows,
                                      std::int32_t ignore_index, float z_loss_weight) {
  LOOM_GRID_STRIDE(r, rows)
  if (targets[r] != ignore_index)
    losses[r] = static_cast<float>(losses[r] + static_cast<double>(z_loss_weight) * lse[r] * lse[r]);
}

__global__ void z_loss_backward_kernel(float* logits, std::int64_t ld, const std::int32_t* targets, const float* lse,
                                       float grad_scale, float z_loss_weight, std::int64_t rows, std::int64_t vocab,
                                       std::int32_t ignore_index) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int32_t target = targets[r];
    if (target == ignore_index) continue;
    const double twice = 2.0 * z_loss_weight * lse[r];
    float* row = logits + r * ld;
    for (std::int64_t j = threadIdx.x; j < vocab; j += kThreads) {
      float v = static_cast<float>(row[j] * (1.0 + twice));
      if (j == target) v = static_cast<float>(v + grad_scale * twice);
      row[j] = v;
    }
  }
}

}  // namespace

#define LOOM_ROWS(kernel, rows, ...)                           \
  do {                                                         \
    if ((rows) <= 0) return;                                   \
    kernel<<<row_blocks(rows), kThreads, 0, s>>>(__VA_ARGS__); \
    LOOM_CHECK_LAUNCH(#kernel);                                \
  } while (0)
#define LOOM_ELEMENTS(kernel, n, ...)                                   \
  do {                                                                  \
    if ((n) <= 0) return;                                               \
    kernel<<<blocks_for((n), kThreads), kThreads, 0, s>>>(__VA_ARGS__); \
    LOOM_CHECK_LAUNCH(#kernel);                                         \
  } while (0)

void launch_cross_entropy_forward(cudaStream_t s, const float* logits, int64_t ld, const int32_t* targets,
                                  float* losses, float* lse, int64_t rows, int64_t vocab, int32_t ignore_index) {
  LOOM_ROWS(cross_entropy_forward_kernel, rows, logits, ld, targets, losses, lse, rows, vocab, ignore_index);
}
void launch_cross_entropy_backward(cudaStream_t s, float* logits, int64_t ld, const int32_t* targets, const float* lse,
                                   float grad_scale, int64_t rows, int64_t vocab, int32_t ignore_index) {
  LOOM_ROWS(cross_entropy_backward_kernel, rows, logits, ld, targets, lse, grad_scale, rows, vocab, ignore_index);
}
void launch_softmax_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols) {
  LOOM_ROWS(softmax_forward_kernel, rows, x, y, rows, cols);
}
void launch_softmax_backward(cudaStream_t s, const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                             bool accumulate) {
  LOOM_ROWS(softmax_backward_kernel, rows, y, dy, dx, rows, cols, accumulate);
}
void launch_logsumexp_forward(cudaStream_t s, const float* x, float* y, int64_t rows, int64_t cols) {
  LOOM_ROWS(logsumexp_forward_kernel, rows, x, y, rows, cols);
}
void launch_logsumexp_backward(cudaStream_t s, const float* x, const float* y, const float* dy, float* dx, int64_t rows,
                               int64_t cols, bool accumulate) {
  LOOM_ELEMENTS(logsumexp_backward_kernel, rows * cols, x, y, dy, dx, rows, cols, accumulate);
}
void launch_sum_forward(cudaStream_t s, const float* x, float* y, int64_t n) {
  // n == 0 still writes y = 0.
  sum_forward_kernel<<<1, kThreads, 0, s>>>(x, y, n);
  LOOM_CHECK_LAUNCH("sum_forward");
}
void launch_sum_backward(cudaStream_t s, const float* dy, float* dx, int64_t n, bool accumulate) {
  LOOM_ELEMENTS(sum_backward_kernel, n, dy, dx, n, accumulate);
}
void launch_loss_reduce(cudaStream_t s, const float* losses, const float* lse, const int32_t* targets, int64_t rows,
                        int32_t ignore_index, float scale, float z_loss_weight, float* out) {
  loss_reduce_kernel<<<1, kThreads, 0, s>>>(losses, lse, targets, rows, ignore_index, scale, z_loss_weight, out);
  LOOM_CHECK_LAUNCH("loss_reduce");
}
void launch_z_loss_forward(cudaStream_t s, float* losses, const float* lse, const int32_t* targets, int64_t rows,
                           int32_t ignore_index, float z_loss_weight) {
  LOOM_ELEMENTS(z_loss_forward_kernel, rows, losses, lse, targets, rows, ignore_index, z_loss_weight);
}
void launch_z_loss_backward(cudaStream_t s, float* logits, int64_t ld, const int32_t* targets, const float* lse,
                            float grad_scale, float z_loss_weight, int64_t rows, int64_t vocab, int32_t ignore_index) {
  LOOM_ROWS(z_loss_backward_kernel, rows, logits, ld, targets, lse, grad_scale, z_loss_weight, rows, vocab,
            ignore_index);
}

}  // namespace loom::cuda
