// backend/cuda: layer norm and RMS norm, forward and backward. One block per row for the row
// statistics (float64 block sums in a fixed tree order), one thread per column for the weight and
// bias gradients (float64, rows in order): deterministic, as reference's float64 loops.
#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

__global__ void layer_norm_forward_kernel(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                          float* rstd, std::int64_t rows, std::int64_t cols, float eps) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    double part = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) part += xr[j];
    const double mu = block_sum(part, shared) / static_cast<double>(cols);
    part = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) part += (xr[j] - mu) * (xr[j] - mu);
    const double var = block_sum(part, shared) / static_cast<double>(cols);
    const double rs = 1.0 / sqrt(var + eps);
    if (threadIdx.x == 0) {
      mean[r] = static_cast<float>(mu);
      rstd[r] = static_cast<float>(rs);
    }
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const double xhat = (xr[j] - mu) * rs;
      y[r * cols + j] = static_cast<float>(xhat * (weight ? weight[j] : 1.0) + (bias ? bias[j] : 0.0));
    }
  }
}

__global__ void layer_norm_dx_kernel(const float* x, const float* weight, const float* mean, const float* rstd,
                                     const float* dy, float* dx, bool accumulate, std::int64_t rows,
                                     std::int64_t cols) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    const float* gr = dy + r * cols;
    const double mu = mean[r], rs = rstd[r];
    double pg = 0.0, pgx = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const double xhat = (xr[j] - mu) * rs;
      const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
      pg += g;
      pgx += g * xhat;
    }
    const double sum_g = block_sum(pg, shared) / static_cast<double>(cols);
    const double sum_gx = block_sum(pgx, shared) / static_cast<double>(cols);
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const double xhat = (xr[j] - mu) * rs;
      const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
      math::store(dx, r * cols + j, rs * (g - sum_g - xhat * sum_gx), accumulate);
    }
  }
}

// dweight (+)= sum_r dy xhat, dbias (+)= sum_r dy; rms: mean == nullptr (xhat = x rstd).
__global__ void norm_params_kernel(const float* x, const float* mean, const float* rstd, const float* dy,
                                   float* dweight, bool accumulate_dweight, float* dbias, bool accumulate_dbias,
                                   std::int64_t rows, std::int64_t cols) {
  LOOM_GRID_STRIDE(j, cols) {
    double dw = 0.0, db = 0.0;
    for (std::int64_t r = 0; r < rows; ++r) {
      const double xv = x[r * cols + j];
      const double xhat = mean ? (xv - mean[r]) * static_cast<double>(rstd[r]) : xv * rstd[r];
      const float g = dy[r * cols + j];
      dw += g * xhat;
      db += g;
    }
    if (dweight) math::store(dweight, j, dw, accumulate_dweight);
    if (dbias) math::store(dbias, j, db, accumulate_dbias);
  }
}

__global__ void rms_norm_forward_kernel(const float* x, const float* weight, float* y, float* rstd, std::int64_t rows,
                                        std::int64_t cols, float eps) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    double part = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) part += static_cast<double>(xr[j]) * xr[j];
    const double ms = block_sum(part, shared) / static_cast<double>(cols);
    const double rs = 1.0 / sqrt(ms + eps);
    if (threadIdx.x == 0) rstd[r] = static_cast<float>(rs);
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads)
      y[r * cols + j] = static_cast<float>(xr[j] * rs * (weight ? weight[j] : 1.0));
  }
}

__global__ void rms_norm_dx_kernel(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                                   bool accumulate, std::int64_t rows, std::int64_t cols) {
  __shared__ double shared[kThreads];
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * cols;
    const float* gr = dy + r * cols;
    const double rs = rstd[r];
    double part = 0.0;
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads)
      part += static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0) * (xr[j] * rs);
    const double sum_gx = block_sum(part, shared) / static_cast<double>(cols);
    for (std::int64_t j = threadIdx.x; j < cols; j += kThreads) {
      const double xhat = xr[j] * rs;
      const double g = static_cast<double>(gr[j]) * (weight ? weight[j] : 1.0);
      math::store(dx, r * cols + j, rs * (g - xhat * sum_gx), accumulate);
    }
  }
}

}  // namespace

void launch_layer_norm_forward(cudaStream_t s, const float* x, const float* weight, const float* bias, float* y,
                               float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  if (rows <= 0) return;
  layer_norm_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, weight, bias, y, mean, rstd, rows, cols, eps);
  LOOM_CHECK_LAUNCH("layer_norm_forward");
}

void launch_layer_norm_backward(Context& c, const float* x, const float* weight, const float* mean, const float* rstd,
                                const float* dy, float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight,
                                float* dbias, bool accumulate_dbias, int64_t rows, int64_t cols) {
  if (dx && rows > 0) {
    layer_norm_dx_kernel<<<row_blocks(rows), kThreads, 0, c.stream>>>(x, weight, mean, rstd, dy, dx, accumulate_dx,
                                                                      rows, cols);
    LOOM_CHECK_LAUNCH("layer_norm_backward (dx)");
  }
  if (dweight || dbias) {
    norm_params_kernel<<<blocks_for(cols, kThreads), kThreads, 0, c.stream>>>(
        x, mean, rstd, dy, dweight, accumulate_dweight, dbias, accumulate_dbias, rows, cols);
    LOOM_CHECK_LAUNCH("layer_norm_backward (dweight, dbias)");
  }
}

void launch_rms_norm_forward(cudaStream_t s, const float* x, const float* weight, float* y, float* rstd, int64_t rows,
                             int64_t cols, float eps) {
  if (rows <= 0) return;
  rms_norm_forward_kernel<<<row_blocks(rows), kThreads, 0, s>>>(x, weight, y, rstd, rows, cols, eps);
  LOOM_CHECK_LAUNCH("rms_norm_forward");
}

void launch_rms_norm_backward(Context& c, const float* x, const float* weight, const float* rstd, const float* dy,
                              float* dx, bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                              int64_t cols) {
  if (dx && rows > 0) {
    rms_norm_dx_kernel<<<row_blocks(rows), kThreads, 0, c.stream>>>(x, weight, rstd, dy, dx, accumulate_dx, rows, cols);
    LOOM_CHECK_LAUNCH("rms_norm_backward (dx)");
  }
  if (dweight) {
    norm_params_kernel<<<blocks_for(cols, kThreads), kThreads, 0, c.stream>>>(
        x, nullptr, rstd, dy, dweight, accumulate_dweight, nullptr, false, rows, cols);
    LOOM_CHECK_LAUNCH("rms_norm_backward (dweight)");
  }
}

}  // namespace loom::cuda
