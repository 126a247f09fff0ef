// Softmax cross-entropy, row by row: the forward reads a row twice (max, then the sum of
// exponentials, with the row still in L2), the backward overwrites it with its gradient.
#include <cmath>
#include <limits>

#include "cpu_backend.hpp"
#include "simd.hpp"

namespace loom::cpu {

void CpuBackend::cross_entropy_forward(const float* logits, int64_t ld, const std::int32_t* targets, float* losses,
                                       float* lse, int64_t rows, int64_t vocab, std::int32_t ignore_index) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const vu iota = iota_u();
  ex_.parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* l = logits + r * ld;
      vf m = splat(neg_inf);
      for (int64_t j = 0; j < vocab; j += lanes)
        m = vmax(m, load_n(l + j, std::min<int64_t>(lanes, vocab - j), neg_inf));
      const float mx = hmax(m);
      const vf vmx = splat(mx);
      vf s = splat(0.0f);
      int64_t j = 0;
      for (; j + lanes <= vocab; j += lanes) s += exp(load(l + j) - vmx);
      if (j < vocab) {
        const vf e = exp(load_n(l + j, vocab - j) - vmx);
        s += iota < splat_u(static_cast<std::uint32_t>(vocab - j)) ? e : splat(0.0f);
      }
      const float z = mx + std::log(hsum(s));
      lse[r] = z;
      losses[r] = targets[r] == ignore_index ? 0.0f : z - l[targets[r]];
    }
  });
}

void CpuBackend::cross_entropy_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse,
                                        float grad_scale, int64_t rows, int64_t vocab, std::int32_t ignore_index) {
  const vf vscale = splat(grad_scale);
  ex_.parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* l = logits + r * ld;
      if (targets[r] == ignore_index) {
        std::fill_n(l, vocab, 0.0f);
        continue;
      }
      const vf z = splat(lse[r]);
      for (int64_t j = 0; j < vocab; j += lanes) {
        const int64_t count = std::min<int64_t>(lanes, vocab - j);
        store_n(l + j, exp(load_n(l + j, count) - z) * vscale, count);
      }
      l[targets[r]] -= grad_scale;
    }
  });
}

}  // namespace loom::cpu
