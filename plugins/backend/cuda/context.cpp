// backend/cuda: the context (context.hpp) and the error checks.
#include "context.hpp"

#include <limits>
#include <loom/error.hpp>
#include <memory>
#include <mutex>
#include <vector>

namespace loom::cuda {

namespace {

std::string where(const char* file, int line) {
  std::string f = file;
  if (const auto slash = f.rfind('/'); slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(line);
}

}  // namespace

void throw_cuda_error(cudaError_t error, const char* call, const char* file, int line) {
  throw InternalError("backend cuda: " + std::string(call) + " failed: " + cudaGetErrorName(error) + " (" +
                      cudaGetErrorString(error) + ") at " + where(file, line));
}

void throw_cublas_error(cublasStatus_t status, const char* call, const char* file, int line) {
  throw InternalError("backend cuda: " + std::string(call) + " failed: " + cublasLtGetStatusName(status) + " (" +
                      cublasLtGetStatusString(status) + ") at " + where(file, line));
}

void check_launch(const char* kernel, const char* file, int line) {
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess)
    throw InternalError("backend cuda: kernel " + std::string(kernel) + " failed to launch: " +
                        cudaGetErrorName(error) + " (" + cudaGetErrorString(error) + ") at " + where(file, line));
#ifdef LOOM_CUDA_SYNC_CHECKS
  const cudaError_t run = cudaDeviceSynchronize();
  if (run != cudaSuccess)
    throw InternalError("backend cuda: kernel " + std::string(kernel) + " failed: " + cudaGetErrorName(run) + " (" +
                        cudaGetErrorString(run) + ") at " + where(file, line));
#endif
}

Context::Scratch::Scratch(Context& context, std::size_t bytes) : context_(context) {
  LOOM_CUDA_CHECK(cudaMallocFromPoolAsync(&data_, bytes == 0 ? 1 : bytes, context_.pool, context_.stream));
}

Context::Scratch::~Scratch() {
  // Stream-ordered: the block returns to the pool once the kernels queued before have used it.
  (void)cudaFreeAsync(data_, context_.stream);
}

void Context::synchronize() {
  LOOM_CUDA_CHECK(cudaStreamSynchronize(stream));
}

namespace {

std::unique_ptr<Context> make_context(int device) {
  int count = 0;
  const cudaError_t probe = cudaGetDeviceCount(&count);
  if (probe != cudaSuccess || count == 0) {
    (void)cudaGetLastError();  // clear the sticky code
    throw DeviceUnavailable(std::string("backend cuda: no CUDA device is available (cudaGetDeviceCount: ") +
                            (probe != cudaSuccess
                                 ? std::string(cudaGetErrorName(probe)) + ", " + cudaGetErrorString(probe)
                                 : std::string("0 devices")) +
                            "): this machine has no NVIDIA GPU, or no driver for it; use backend.type: cpu");
  }
  if (device >= count)
    throw UserError("backend.device is " + std::to_string(device) + ", but this machine has " + std::to_string(count) +
                    " CUDA device" + (count == 1 ? "" : "s") + ": use 0 to " + std::to_string(count - 1));
  auto c = std::make_unique<Context>();
  c->device = device;
  LOOM_CUDA_CHECK(cudaGetDeviceProperties(&c->properties, device));
  if (c->properties.major < 8)
    throw DeviceUnavailable("backend cuda: device " + std::to_string(device) + " (" + c->properties.name +
                            ") has compute capability " + std::to_string(c->properties.major) + "." +
                            std::to_string(c->properties.minor) +
                            "; loom's CUDA kernels need 8.0 or newer (A100, H100, H200, ...)");
  LOOM_CUDA_CHECK(cudaSetDevice(device));
  LOOM_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
  LOOM_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&c->pool, device));
  // Keep freed blocks in the pool (a training step frees and reallocates the same sizes): the
  // default threshold of 0 would give memory back to the driver at every synchronisation.
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  LOOM_CUDA_CHECK(cudaMemPoolSetAttribute(c->pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  LOOM_CUBLAS_CHECK(cublasLtCreate(&c->lt));
  // cuBLASLt's recommended workspace for Hopper (32 MiB; 4 MiB is enough before it).
  c->workspace_bytes = c->properties.major >= 9 ? std::size_t{32} << 20 : std::size_t{4} << 20;
  LOOM_CUDA_CHECK(cudaMalloc(&c->workspace, c->workspace_bytes));
  return c;
}

}  // namespace

Context& context(int device) {
  static std::mutex mutex;
  static std::vector<Context*> contexts;  // by device; never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  if (device >= 0 && static_cast<std::size_t>(device) < contexts.size() && contexts[static_cast<std::size_t>(device)])
    return *contexts[static_cast<std::size_t>(device)];
  std::unique_ptr<Context> made = make_context(device);
  if (contexts.size() <= static_cast<std::size_t>(device)) contexts.resize(static_cast<std::size_t>(device) + 1);
  contexts[static_cast<std::size_t>(device)] = made.release();
  return *contexts[static_cast<std::size_t>(device)];
}

}  // namespace loom::cuda
