// backend/cuda: the buffer type (buffer_type.hpp).
#include "buffer_type.hpp"

#include <loom/error.hpp>
#include <mutex>
#include <new>
#include <string>
#include <vector>

namespace loom::cuda {

namespace {

void check_range(const Storage& s, std::size_t offset, std::size_t bytes, const char* what) {
  if (offset > s.bytes || bytes > s.bytes - offset)
    throw InternalError(std::string("backend cuda: ") + what + " of " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(offset) + " overruns a block of " + std::to_string(s.bytes));
}

}  // namespace

CudaBufferType& CudaBufferType::of(Context& context) {
  static std::mutex mutex;
  static std::vector<CudaBufferType*> types;
  std::lock_guard<std::mutex> lock(mutex);
  for (CudaBufferType* t : types)
    if (&t->context_ == &context) return *t;
  auto* t = new CudaBufferType(context);  // never destroyed: tensors may be released at exit
  register_buffer_type(*t);
  types.push_back(t);
  return *t;
}

Storage* CudaBufferType::allocate(std::size_t bytes) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  auto* s = new Storage;
  void* p = nullptr;
  const cudaError_t error = cudaMallocFromPoolAsync(&p, rounded, context_.pool, context_.stream);
  if (error != cudaSuccess) {
    delete s;
    (void)cudaGetLastError();
    if (error == cudaErrorMemoryAllocation) throw std::bad_alloc();
    throw_cuda_error(error, "cudaMallocFromPoolAsync", __FILE__, __LINE__);
  }
  s->data = static_cast<std::byte*>(p);
  s->bytes = rounded;
  s->type = this;
  s->host_visible = false;
  s->refs.store(1, std::memory_order_relaxed);
  return s;
}

void CudaBufferType::release(Storage* s) noexcept {
  (void)cudaFreeAsync(s->data, context_.stream);
  delete s;
}

void CudaBufferType::copy_to_host(void* host, const Storage& src, std::size_t offset, std::size_t bytes) {
  check_range(src, offset, bytes, "copy_to_host");
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(host, src.data + offset, bytes, cudaMemcpyDeviceToHost, context_.stream));
  context_.synchronize();
}

void CudaBufferType::copy_from_host(Storage& dst, std::size_t offset, const void* host, std::size_t bytes) {
  check_range(dst, offset, bytes, "copy_from_host");
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemcpyAsync(dst.data + offset, host, bytes, cudaMemcpyHostToDevice, context_.stream));
  // The host buffer may be gone when this returns.
  context_.synchronize();
}

void CudaBufferType::copy(Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
                          std::size_t bytes) {
  check_range(dst, dst_offset, bytes, "copy");
  check_range(src, src_offset, bytes, "copy");
  if (bytes == 0) return;
  std::byte* to = dst.data + dst_offset;
  const std::byte* from = src.data + src_offset;
  if (to == from) return;
  if (to < from + bytes && from < to + bytes) {
    // Overlapping ranges (memmove semantics, which cudaMemcpy does not promise): through scratch.
    Context::Scratch staging(context_, bytes);
    LOOM_CUDA_CHECK(cudaMemcpyAsync(staging.as<std::byte>(), from, bytes, cudaMemcpyDeviceToDevice, context_.stream));
    LOOM_CUDA_CHECK(cudaMemcpyAsync(to, staging.as<std::byte>(), bytes, cudaMemcpyDeviceToDevice, context_.stream));
    return;
  }
  LOOM_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, context_.stream));
}

void CudaBufferType::fill_zero(Storage& dst, std::size_t offset, std::size_t bytes) {
  check_range(dst, offset, bytes, "fill_zero");
  if (bytes == 0) return;
  LOOM_CUDA_CHECK(cudaMemsetAsync(dst.data + offset, 0, bytes, context_.stream));
}

std::optional<DeviceMemory> CudaBufferType::memory() const {
  std::size_t free = 0, total = 0;
  LOOM_CUDA_CHECK(cudaSetDevice(context_.device));
  LOOM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return DeviceMemory{static_cast<std::int64_t>(free), static_cast<std::int64_t>(total)};
}

}  // namespace loom::cuda
