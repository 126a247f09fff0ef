// The roof that MFU is measured against when trainer.peak_flops is unset.
#include <algorithm>
#include <chrono>

#include "loom/kinds/backend.hpp"
#include "loom/run/trainer.hpp"
#include "loom/tensor.hpp"

namespace loom {

namespace {

// The best of a few square products large enough for the backend's fastest path (the first run
// warms the pool and the packing buffers and is not counted).
template <class Product>
double best_flops(std::int64_t n, Product&& product) {
  using Clock = std::chrono::steady_clock;
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    product();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * static_cast<double>(n) * n * n / dt);
  }
  return best;
}

}  // namespace

PeakFlops probe_peak_flops(Backend& backend) {
  const std::int64_t n = 1536;
  Tensor a = Tensor::full(Shape{n, n}, 0.5f), b = Tensor::full(Shape{n, n}, 0.25f), c = Tensor::empty(Shape{n, n});
  PeakFlops peak;
  // Backend::gemm is what the run's matrix products call: its roof is in the precision the
  // backend computes them in (float32, or bf16 under the cpu backend's matmul_precision: bf16).
  peak.matmul = best_flops(n, [&] {
    backend.gemm(Transpose::no, Transpose::no, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                 c.data<float>(), n);
  });
  if (backend.supports_op(BackendOp::gemm, DType::bf16))
    peak.bf16 = best_flops(n, [&] {
      backend.gemm_bf16(Transpose::no, Transpose::no, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                        c.data<float>(), n);
    });
  return peak;
}

}  // namespace loom
