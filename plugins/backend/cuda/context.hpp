// backend/cuda: the one context every backend object and the buffer type share (ggml-cuda's
// ggml_backend_cuda_context): the device, one stream on which everything runs in order (every
// kernel, every copy, every allocation and release of the pool), the cuBLASLt handle and its
// workspace, and the device's stream-ordered memory pool. Created on first use, never destroyed
// (tensors may be released at exit; the process's end releases the device).
//
// Error checking: every CUDA and cuBLAS call goes through LOOM_CUDA_CHECK / LOOM_CUBLAS_CHECK,
// and every kernel launch is followed by check_launch: a failure is an InternalError naming the
// call, the error and the source line, never an unchecked code.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace loom::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line);

#define LOOM_CUDA_CHECK(call)                                                                                         \
  do {                                                                                                                \
    const cudaError_t loom_cuda_error_ = (call);                                                                      \
    if (loom_cuda_error_ != cudaSuccess) ::loom::cuda::throw_cuda_error(loom_cuda_error_, #call, __FILE__, __LINE__); \
  } while (0)
#define LOOM_CUBLAS_CHECK(call)                                                         \
  do {                                                                                  \
    const cublasStatus_t loom_cublas_status_ = (call);                                  \
    if (loom_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                   \
      ::loom::cuda::throw_cublas_error(loom_cublas_status_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: the launch's own error (bad configuration, no kernel image for this
// GPU), and in a build with LOOM_CUDA_SYNC_CHECKS the kernel's execution too.
void check_launch(const char* kernel, const char* file, int line);
#define LOOM_CHECK_LAUNCH(kernel) ::loom::cuda::check_launch(kernel, __FILE__, __LINE__)

struct Context {
  int device = 0;
  cudaDeviceProp properties{};
  cudaStream_t stream = nullptr;
  cudaMemPool_t pool = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;  // cuBLASLt's
  std::size_t workspace_bytes = 0;

  // Scratch device memory from the pool, returned to it (stream-ordered) when destroyed.
  class Scratch {
   public:
    Scratch(Context& context, std::size_t bytes);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    template <class T>
    T* as() const {
      return static_cast<T*>(data_);
    }

   private:
    Context& context_;
    void* data_ = nullptr;
  };

  // Waits for everything queued on the stream (the host then reads what it copied out).
  void synchronize();
};

// The context of CUDA device `device`, created on first use. Throws DeviceUnavailable when the
// machine has no CUDA device or driver, or a GPU older than the kernels' sm_80; UserError for an
// index past its devices.
Context& context(int device);

// Grid size for n elements at `threads` per block, capped (the kernels loop over the rest).
inline unsigned blocks_for(std::int64_t n, int threads) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : b > 65535 * 8 ? 65535 * 8 : b);
}

}  // namespace loom::cuda
