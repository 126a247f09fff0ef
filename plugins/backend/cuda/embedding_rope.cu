// backend/cuda: the embedding lookup and its deterministic backward, and rotary embeddings.
#include <cub/device/device_radix_sort.cuh>

#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

__global__ void embedding_forward_kernel(const float* table, const std::int32_t* ids, float* out, std::int64_t n,
                                         std::int64_t dim) {
  LOOM_GRID_STRIDE(i, n * dim) {
    const std::int64_t row = i / dim, j = i % dim;
    out[i] = table[static_cast<std::int64_t>(ids[row]) * dim + j];
  }
}

__global__ void iota_kernel(std::int32_t* v, std::int64_t n) {
  LOOM_GRID_STRIDE(i, n) v[i] = static_cast<std::int32_t>(i);
}

// Block b takes sorted position b when it starts a run of equal ids: the run's rows of dout, in
// increasing i (the stable sort kept that order), summed in float64 per column and added once.
__global__ void embedding_backward_kernel(const std::int32_t* sorted_ids, const std::int32_t* order, const float* dout,
                                          float* dtable, std::int64_t n, std::int64_t dim) {
  for (std::int64_t s = blockIdx.x; s < n; s += gridDim.x) {
    const std::int32_t id = sorted_ids[s];
    if (s > 0 && sorted_ids[s - 1] == id) continue;
    std::int64_t end = s + 1;
    while (end < n && sorted_ids[end] == id) ++end;
    for (std::int64_t j = threadIdx.x; j < dim; j += blockDim.x) {
      double acc = 0.0;
      for (std::int64_t t = s; t < end; ++t) acc += dout[static_cast<std::int64_t>(order[t]) * dim + j];
      math::store(dtable, static_cast<std::int64_t>(id) * dim + j, acc, true);
    }
  }
}

__global__ void rope_kernel(const float* x, std::int64_t x_batch_stride, std::int64_t x_token_stride, float* y,
                            std::int64_t y_batch_stride, std::int64_t y_token_stride, const float* cos,
                            const float* sin, const std::int32_t* positions, std::int64_t position_offset,
                            std::int64_t batch, std::int64_t seq, std::int64_t heads, std::int64_t head_dim,
                            bool interleaved, bool inverse, bool accumulate) {
  const std::int64_t half = head_dim / 2;
  LOOM_GRID_STRIDE(e, batch * seq * heads * half) {
    const std::int64_t i = e % half;
    const std::int64_t h = (e / half) % heads;
    const std::int64_t t = (e / (half * heads)) % seq;
    const std::int64_t b = e / (half * heads * seq);
    const std::int64_t pos = positions ? positions[b * seq + t] : position_offset + t;
    const float* xt = x + b * x_batch_stride + t * x_token_stride;
    float* yt = y + b * y_batch_stride + t * y_token_stride;
    const std::int64_t ia = h * head_dim + (interleaved ? 2 * i : i);
    const std::int64_t ib = h * head_dim + (interleaved ? 2 * i + 1 : i + half);
    const double c = cos[pos * half + i];
    const double s = inverse ? -static_cast<double>(sin[pos * half + i]) : sin[pos * half + i];
    double ya, yb;
    math::rope_pair(xt[ia], xt[ib], c, s, ya, yb);
    math::store(yt, ia, ya, accumulate);
    math::store(yt, ib, yb, accumulate);
  }
}

}  // namespace

void launch_embedding_forward(cudaStream_t s, const float* table, const int32_t* ids, float* out, int64_t n,
                              int64_t dim) {
  if (n <= 0 || dim <= 0) return;
  embedding_forward_kernel<<<blocks_for(n * dim, kThreads), kThreads, 0, s>>>(table, ids, out, n, dim);
  LOOM_CHECK_LAUNCH("embedding_forward");
}

void launch_embedding_backward(Context& c, const int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                               int64_t vocab) {
  if (n <= 0 || dim <= 0) return;
  const int items = static_cast<int>(n);
  // Sort only the bits an id in [0, vocab) can have.
  int end_bit = 1;
  while (end_bit < 31 && (std::int64_t{1} << end_bit) < vocab) ++end_bit;
  Context::Scratch order_in(c, sizeof(std::int32_t) * static_cast<std::size_t>(n));
  Context::Scratch order_out(c, sizeof(std::int32_t) * static_cast<std::size_t>(n));
  Context::Scratch ids_out(c, sizeof(std::int32_t) * static_cast<std::size_t>(n));
  iota_kernel<<<blocks_for(n, kThreads), kThreads, 0, c.stream>>>(order_in.as<std::int32_t>(), n);
  LOOM_CHECK_LAUNCH("embedding_backward (iota)");
  std::size_t temp_bytes = 0;
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids, ids_out.as<std::int32_t>(),
                                                  order_in.as<std::int32_t>(), order_out.as<std::int32_t>(), items, 0,
                                                  end_bit, c.stream));
  Context::Scratch temp(c, temp_bytes);
  LOOM_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, ids, ids_out.as<std::int32_t>(),
                                                  order_in.as<std::int32_t>(), order_out.as<std::int32_t>(), items, 0,
                                                  end_bit, c.stream));
  const int threads = dim >= 256 ? 256 : dim >= 128 ? 128 : 64;
  embedding_backward_kernel<<<row_blocks(n), threads, 0, c.stream>>>(
      ids_out.as<std::int32_t>(), order_out.as<std::int32_t>(), dout, dtable, n, dim);
  LOOM_CHECK_LAUNCH("embedding_backward");
}

void launch_rope(cudaStream_t s, const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y,
                 int64_t y_batch_stride, int64_t y_token_stride, const float* cos, const float* sin,
                 const int32_t* positions, int64_t position_offset, int64_t batch, int64_t seq, int64_t heads,
                 int64_t head_dim, bool interleaved, bool inverse, bool accumulate) {
  const int64_t work = batch * seq * heads * (head_dim / 2);
  if (work <= 0) return;
  rope_kernel<<<blocks_for(work, kThreads), kThreads, 0, s>>>(
      x, x_batch_stride, x_token_stride, y, y_batch_stride, y_token_stride, cos, sin, positions, position_offset, batch,
      seq, heads, head_dim, interleaved, inverse, accumulate);
  LOOM_CHECK_LAUNCH("rope");
}

}  // namespace loom::cuda
