// backend/cuda: the options the plugin (cuda_plugin.cpp, no CUDA dependency) passes to the
// kernels' library (cuda-backend-kernels.so), which it loads when a backend is created.
#pragma once

#include <cstdint>

namespace loom {
class Backend;
}

namespace loom::cuda {

// How the float32 matrix products (gemm, gemm_batched, linear_forward) compute.
enum class MatmulPrecision : std::uint8_t {
  f32,   // float32 operands and accumulation, no TF32 (cuBLASLt's CUBLAS_COMPUTE_32F)
  tf32,  // operands rounded to TF32 by the tensor cores, float32 accumulation (only when asked)
  bf16,  // operands rounded to bfloat16 (nearest even), float32 accumulation: gemm_bf16's product
};

struct CudaOptions {
  int device = 0;
  MatmulPrecision precision = MatmulPrecision::bf16;
};

// The one entry point of cuda-backend-kernels.so: creates the backend on options.device.
// Throws loom::DeviceUnavailable when this machine has no usable CUDA device.
using MakeCudaBackend = loom::Backend*(const CudaOptions&);

}  // namespace loom::cuda

// The symbol cuda_plugin.cpp looks up.
#define LOOM_CUDA_BACKEND_ENTRY "loom_cuda_backend"
// Exported beside it: `void* loom_cuda_stream(int device)`, the backend's stream on that device
// (cuda_backend.cpp), which attention/cuda-flash looks up by this name.
#define LOOM_CUDA_STREAM_ENTRY "loom_cuda_stream"
