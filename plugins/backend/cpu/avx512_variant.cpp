// The entry point of cpu-backend-avx512.so: the cpu backend's kernels compiled for AVX-512
// (CMakeLists.txt), created by the plugin on a CPU that has AVX-512 F, CD, BW, DQ and VL.
#include "cpu_backend.hpp"

extern "C" __attribute__((visibility("default"))) loom::Backend* loom_cpu_avx512_backend(
    loom::ExecutionContext& execution, const loom::cpu::CpuOptions& options) {
  return new loom::cpu::CpuBackend(execution, options);
}
