// backend/cpu: registration and options.
#include "cpu_backend.hpp"

#include <loom/plugin.hpp>
#include <memory>

namespace {

loom::OptionSchema options() {
  loom::OptionSchema s;
  s.integer("gemm_parallel_min_work", std::int64_t{1} << 21,
            "GEMMs with m*n*k below this run as one BLAS call on the calling thread instead of one panel per thread.")
      .min(1);
  s.integer("grain", 16384,
            "Elements per parallel chunk of the elementwise kernels; smaller loops run inline on the calling thread.")
      .min(256);
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
        return std::make_unique<loom::cpu::CpuBackend>(ctx.execution(), opts);
      });
}

}  // namespace

LOOM_PLUGIN(register_components)
