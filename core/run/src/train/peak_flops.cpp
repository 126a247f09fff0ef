// The roof that MFU is measured against when trainer.peak_flops is unset.
#include <algorithm>
#include <chrono>

#include "loom/kinds/backend.hpp"
#include "loom/run/trainer.hpp"
#include "loom/tensor.hpp"

namespace loom {

double probe_peak_flops(Backend& backend) {
  using Clock = std::chrono::steady_clock;
  // A few square sgemms large enough for the backend's fastest path; the best of them.
  const std::int64_t n = 1536;
  Tensor a = Tensor::full(Shape{n, n}, 0.5f), b = Tensor::full(Shape{n, n}, 0.25f), c = Tensor::empty(Shape{n, n});
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    const auto t0 = Clock::now();
    backend.gemm(Transpose::no, Transpose::no, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
                 c.data<float>(), n);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (rep > 0) best = std::max(best, 2.0 * static_cast<double>(n) * n * n / dt);
  }
  return best;
}

}  // namespace loom
