// backend/cuda: registration and options. This library links no CUDA library: it loads on any
// machine (`loom plugins` lists the backend everywhere), and creating the backend loads the
// kernels' library (cuda-backend-kernels.so beside it, linked to the CUDA runtime and cuBLASLt)
// on first use. Without a GPU, a driver or the CUDA libraries, creation throws
// loom::DeviceUnavailable: `loom train ... backend.type=cuda` exits 2 with that one message,
// and the conformance suites skip.
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <loom/error.hpp>
#include <loom/kinds/backend.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

#include "cuda_options.hpp"

namespace {

loom::cuda::MakeCudaBackend* kernels_factory() {
  static loom::cuda::MakeCudaBackend* const factory = [] {
    const boost::dll::fs::path path = boost::dll::this_line_location().parent_path() / LOOM_CUDA_KERNELS_LIBRARY;
    if (!boost::dll::fs::exists(path))
      throw loom::InternalError("backend cuda: its kernels' library " + path.string() +
                                " is missing; reinstall loom (or rebuild it with the CUDA toolkit)");
    static boost::dll::shared_library library;
    try {
      library.load(path, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
    } catch (const std::exception& e) {
      // The CUDA runtime or cuBLAS libraries are not installed here (libcudart.so.13,
      // libcublasLt.so.13): the machine cannot run the backend.
      throw loom::DeviceUnavailable(
          "backend cuda: the CUDA libraries its kernels need cannot be loaded (" + std::string(e.what()) +
          "); install the CUDA 13 runtime and cuBLAS (docs/cuda.md), or use backend.type: cpu");
    }
    return &library.get<loom::cuda::MakeCudaBackend>(LOOM_CUDA_BACKEND_ENTRY);
  }();
  return factory;
}

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("device", 0, "The CUDA device (an index among the machine's GPUs, as CUDA numbers them).").min(0);
  s.string("matmul_precision", "auto",
           "Compute dtype of the float32 matrix products (gemm, linear layers, output layer; the attention kernels "
           "follow it): auto (bf16 on the GPU), f32 (float32 exactly: no TF32), tf32 (operands rounded to TF32 by "
           "the tensor cores, float32 accumulation; only when named), or bf16 (operands rounded to bfloat16, "
           "float32 accumulation: mixed precision with float32 weights, optimizer state and everything else).")
      .one_of({"auto", "f32", "tf32", "bf16"});
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Backend>(
      {.name = "cuda",
       .description = "NVIDIA GPU: cuBLASLt products, CUDA kernels, memory from a stream-ordered pool",
       .version = "0.1.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext&) {
        loom::cuda::CudaOptions opts;
        opts.device = static_cast<int>(o.get<std::int64_t>("device"));
        const std::string precision = o.get<std::string>("matmul_precision");
        opts.precision = precision == "f32"    ? loom::cuda::MatmulPrecision::f32
                         : precision == "tf32" ? loom::cuda::MatmulPrecision::tf32
                                               : loom::cuda::MatmulPrecision::bf16;
        return std::unique_ptr<loom::Backend>(kernels_factory()(opts));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
