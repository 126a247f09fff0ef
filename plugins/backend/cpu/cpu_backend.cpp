// backend/cpu: registration and options.
#include "cpu_backend.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <iostream>
#include <loom/error.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

namespace {

// AVX-512 as the side library's kernels use it (F, CD, BW, DQ, VL: x86-64-v4). GCC's check
// includes the operating system's support for the zmm state.
bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

#ifdef LOOM_CPU_AVX512_VARIANT
using MakeBackend = loom::Backend*(loom::ExecutionContext&, const loom::cpu::CpuOptions&);

// The kernels compiled for AVX-512 (CMakeLists.txt), beside this plugin. Loaded once, on first
// use, and kept for the life of the process, as the plugin host keeps plugins.
MakeBackend* avx512_factory() {
  static MakeBackend* const factory = [] {
    const boost::dll::fs::path path = boost::dll::this_line_location().parent_path() / LOOM_CPU_AVX512_VARIANT;
    static boost::dll::shared_library library;
    try {
      library.load(path, boost::dll::load_mode::rtld_local | boost::dll::load_mode::rtld_now);
      return &library.get<MakeBackend>("loom_cpu_avx512_backend");
    } catch (const std::exception& e) {
      throw loom::InternalError("backend cpu: its AVX-512 kernels (" + path.string() + ") could not be loaded: " +
                                e.what() + "; reinstall loom, or set backend.kernels: baseline");
    }
  }();
  return factory;
}
#endif

std::unique_ptr<loom::Backend> make_backend(loom::ExecutionContext& execution, const loom::cpu::CpuOptions& options,
                                            const std::string& kernels) {
  const bool avx512 = cpu_has_avx512();
  if (kernels == "avx512" && !avx512)
    throw loom::UserError(
        "backend.kernels: avx512 asked for, but this CPU lacks AVX-512 (F, CD, BW, DQ and VL); "
        "use auto or baseline");
#ifdef LOOM_CPU_AVX512_VARIANT
  if (avx512 && kernels != "baseline") return std::unique_ptr<loom::Backend>(avx512_factory()(execution, options));
#endif
  // A -DLOOM_NATIVE=ON build has one set of kernels, compiled for the building CPU.
  return std::make_unique<loom::cpu::CpuBackend>(execution, options);
}

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("gemm_parallel_min_work", std::int64_t{1} << 21,
            "GEMMs with m*n*k below this run as one BLAS call on the calling thread instead of one panel per thread.")
      .min(1);
  s.integer("grain", 16384,
            "Elements per parallel chunk of the elementwise kernels; smaller loops run inline on the calling thread.")
      .min(256);
  s.string("matmul_precision", "auto",
           "Compute dtype of the backend's matrix products (gemm, linear layers, output layer; the attention kernels "
           "follow it): auto (bf16 where the CPU has AVX512-BF16, else f32), f32, or bf16 (operands rounded to "
           "bfloat16, float32 accumulation: mixed precision with float32 weights, optimizer state and everything "
           "else; without AVX512-BF16, f32 with a warning). Levanter's mp c=bfloat16, MaxText's dtype: bfloat16.")
      .one_of({"auto", "f32", "bf16"});
  s.string("kernels", "auto",
           "Instruction set of the elementwise, norm, loss and GEMM-packing kernels: auto (AVX-512 where the CPU "
           "has it, else the build's baseline, x86-64-v3 by default), baseline, or avx512 (an error on a CPU "
           "without it). Results may differ in the last bits between the two.")
      .one_of({"auto", "baseline", "avx512"});
  return s;
}

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Backend>(
      {.name = "cpu",
       .description = "OpenBLAS GEMMs and vectorised, fused, TBB-parallel kernels on the core's thread pool",
       .version = "1.0.0",
       .options = options()},
      [](const loom::Options& o, const loom::CreateContext& ctx) {
        loom::cpu::CpuOptions opts;
        opts.gemm_parallel_min_work = o.get<std::int64_t>("gemm_parallel_min_work");
        opts.grain = o.get<std::int64_t>("grain");
        const std::string precision = o.get<std::string>("matmul_precision");
        // auto: bf16 where the CPU can (the quality bar of docs/training.md "Mixed precision"
        // holds), float32 silently elsewhere. Only an explicit bf16 that cannot be honoured warns.
        opts.bf16_matmuls = precision == "bf16" || (precision == "auto" && loom::cpu::cpu_has_avx512_bf16());
        if (precision == "bf16" && !loom::cpu::cpu_has_avx512_bf16()) {
          // Once per process: the trainer and evaluation may create several backends.
          static const bool warned = [] {
            std::cerr << "warning: backend.matmul_precision: bf16 asked for, but this CPU has no AVX512-BF16: "
                         "the cpu backend computes its matrix products in float32\n";
            return true;
          }();
          (void)warned;
        }
        return make_backend(ctx.execution(), opts, o.get<std::string>("kernels"));
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
