// backend/cuda: device memory (device.hpp's BufferType) from the context's stream-ordered pool.
#pragma once

#include <loom/device.hpp>

#include "context.hpp"

namespace loom::cuda {

// Device "cuda:N": blocks from cudaMallocFromPoolAsync on the context's stream, released with
// cudaFreeAsync on it (so a block freed while kernels that use it are queued is reused only after
// them). Copies to and from the host are cudaMemcpyAsync followed by the stream's
// synchronisation (the data are in place when they return, as the contract says); copies within
// the device and zero-fills are queued on the stream, in order with every kernel.
class CudaBufferType final : public BufferType {
 public:
  // The buffer type of the context's device, registered on first use; never destroyed.
  static CudaBufferType& of(Context& context);

  Device device() const override { return Device("cuda", context_.device); }
  bool host_visible() const override { return false; }
  Storage* allocate(std::size_t bytes) override;
  void release(Storage* storage) noexcept override;
  void copy_to_host(void* host, const Storage& src, std::size_t offset, std::size_t bytes) override;
  void copy_from_host(Storage& dst, std::size_t offset, const void* host, std::size_t bytes) override;
  void copy(Storage& dst, std::size_t dst_offset, const Storage& src, std::size_t src_offset,
            std::size_t bytes) override;
  void fill_zero(Storage& dst, std::size_t offset, std::size_t bytes) override;
  // cudaMemGetInfo: what the driver can still give (the pool's cached blocks count as used).
  std::optional<DeviceMemory> memory() const override;

 private:
  explicit CudaBufferType(Context& context) : context_(context) {}
  Context& context_;
};

}  // namespace loom::cuda
