// The roof that MFU is measured against when trainer.peak_flops is unset.
#include <algorithm>
#include <chrono>

#include "loom/kinds/backend.hpp"
#include "loom/run/trainer.hpp"
#include "loom/tensor.hpp"

namespace loom {

namespace {

// The best of many square products large enough for the backend's fastest path (the first run
// warms the pool and the packing buffers and is not counted): at least 8, and more, up to 40,
// while the timed ones take under 0.6 s. On shared cores one product of a few milliseconds is
// easily interrupted, and a roof read low makes an MFU above 100% (the step line then says the
// roof is too low); the best of many is the least disturbed.
template <class Product>
double best_flops(std::int64_t n, Product&& product) {
  using Clock = std::chrono::steady_clock;
  double best = 0, spent = 0;
  for (int rep = 0; rep <= 40 && (rep <= 8 || spent < 0.6); ++rep) {
    const auto t0 = Clock::now();
    product();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep == 0) continue;
    spent += dt;
    best = std::max(best, 2.0 * static_cast<double>(n) * n * n / dt);
  }
  return best;
}

}  // namespace

PeakFlops probe_peak_flops(Backend& backend) {
  const std::int64_t n = 1536;
  // The operands in the backend's memory (copied there once when it is a device's).
  const Device device = backend.device();
  const Tensor a = Tensor::full(Shape{n, n}, 0.5f).to(device), b = Tensor::full(Shape{n, n}, 0.25f).to(device);
  const Tensor c = Tensor::empty(Shape{n, n}, DType::f32, device);
  PeakFlops peak;
  // The roof is that of the precision the backend actually computes its products in
  // (matmul_dtype(): a bf16 request the CPU cannot honour is float32 here), not of what the
  // config asked for.
  peak.compute = backend.matmul_dtype();
  if (backend.supports_op(BackendOp::gemm, DType::bf16))
    peak.bf16 = best_flops(n, [&] {
      backend.gemm_bf16(Transpose::no, Transpose::no, n, n, n, 1.0f, a.device_data<float>(), n, b.device_data<float>(),
                        n, 0.0f, c.device_data<float>(), n);
    });
  if (peak.compute == DType::bf16 && peak.bf16 > 0)
    peak.matmul = peak.bf16;
  else
    peak.matmul = best_flops(n, [&] {
      backend.gemm(Transpose::no, Transpose::no, n, n, n, 1.0f, a.device_data<float>(), n, b.device_data<float>(), n,
                   0.0f, c.device_data<float>(), n);
    });
  return peak;
}

}  // namespace loom
