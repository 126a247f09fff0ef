// backend/cpu: registration and options.
#include "cpu_backend.hpp"

#include <iostream>
#include <loom/plugin.hpp>
#include <memory>
#include <string>

namespace {

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
        return std::make_unique<loom::cpu::CpuBackend>(ctx.execution(), opts);
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
