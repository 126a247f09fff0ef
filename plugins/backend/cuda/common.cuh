// backend/cuda: what the .cu files share: grid-stride loops and the deterministic block sum.
#pragma once

#include <cstdint>

#include "context.hpp"
#include "kernel_math.hpp"

namespace loom::cuda {

inline constexpr int kThreads = 256;

#define LOOM_GRID_STRIDE(i, n)                                                                     \
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)

// The sum of every thread's `value` over a block of kThreads threads, in a fixed tree order
// (so the same inputs give the same bits on every run), returned to every thread. `shared` holds
// kThreads doubles; the block synchronises.
__device__ inline double block_sum(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width) shared[threadIdx.x] += shared[threadIdx.x + width];
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

__device__ inline double block_max(double value, double* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int width = kThreads / 2; width > 0; width /= 2) {
    if (static_cast<int>(threadIdx.x) < width)
      shared[threadIdx.x] = fmax(shared[threadIdx.x], shared[threadIdx.x + width]);
    __syncthreads();
  }
  const double total = shared[0];
  __syncthreads();
  return total;
}

// Grid size for one block per row (capped: the kernels loop over the rest).
inline unsigned row_blocks(std::int64_t rows) {
  return static_cast<unsigned>(rows < 1 ? 1 : rows > 65535 * 4 ? 65535 * 4 : rows);
}

}  // namespace loom::cuda
