// The kernel groups of the operations the core computed on the host until issue 25 (mul,
// softcap, softmax, logsumexp, sum, and the losses' reductions and z-loss terms). Each is the
// core's former loop, expression for expression (scalar libm tanh and exp, float64 sums in index
// order), so that results stay bit for bit what they were; the speed comes from running
// independent elements and rows in parallel, never from reordering a sum.
#include <algorithm>
#include <cmath>

#include "cpu_backend.hpp"

namespace loom::cpu {

void CpuBackend::mul(const float* a, const float* b, float* y, int64_t n, bool accumulate) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    if (accumulate) {
      for (int64_t i = begin; i < end; ++i) y[i] += a[i] * b[i];
    } else {
      for (int64_t i = begin; i < end; ++i) y[i] = a[i] * b[i];
    }
  });
}

void CpuBackend::softcap_forward(const float* x, float* y, float* tanh_out, int64_t n, float cap) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float h = std::tanh(x[i] / cap);
      y[i] = cap * h;
      if (tanh_out) tanh_out[i] = h;
    }
  });
}

void CpuBackend::softcap_backward(const float* h, float h_scale, const float* dy, float* dx, int64_t n,
                                  bool accumulate) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float t = h[i] * h_scale;
      if (accumulate)
        dx[i] += dy[i] * (1.0f - t * t);
      else
        dx[i] = dy[i] * (1.0f - t * t);
    }
  });
}

void CpuBackend::softmax_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const float m = *std::max_element(xr, xr + cols);
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += (yr[c] = std::exp(xr[c] - m));
      const auto inv = static_cast<float>(1.0 / s);
      for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
    }
  });
}

void CpuBackend::softmax_backward(const float* y, const float* dy, float* dx, int64_t rows, int64_t cols,
                                  bool accumulate) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(dy[r * cols + c]) * y[r * cols + c];
      const auto dot = static_cast<float>(s);
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
        if (accumulate)
          dx[i] += y[i] * (dy[i] - dot);
        else
          dx[i] = y[i] * (dy[i] - dot);
      }
    }
  });
}

void CpuBackend::logsumexp_forward(const float* x, float* y, int64_t rows, int64_t cols) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* xr = x + r * cols;
      const float m = *std::max_element(xr, xr + cols);
      double s = 0;
      for (int64_t c = 0; c < cols; ++c) s += std::exp(static_cast<double>(xr[c] - m));
      y[r] = m + static_cast<float>(std::log(s));
    }
  });
}

void CpuBackend::logsumexp_backward(const float* x, const float* y, const float* dy, float* dx, int64_t rows,
                                    int64_t cols, bool accumulate) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t i = r * cols; i < (r + 1) * cols; ++i) {
        if (accumulate)
          dx[i] += dy[r] * std::exp(x[i] - y[r]);
        else
          dx[i] = dy[r] * std::exp(x[i] - y[r]);
      }
  });
}

void CpuBackend::sum_forward(const float* x, float* y, int64_t n) {
  // One float64 sum in index order: its value must not depend on how work is split.
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  y[0] = static_cast<float>(s);
}

void CpuBackend::sum_backward(const float* dy, float* dx, int64_t n, bool accumulate) {
  const float g = dy[0];
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    if (accumulate) {
      for (int64_t i = begin; i < end; ++i) dx[i] += g;
    } else {
      for (int64_t i = begin; i < end; ++i) dx[i] = g;
    }
  });
}

void CpuBackend::loss_reduce(const float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                             std::int32_t ignore_index, float scale, float z_loss_weight, float* out) {
  double s = 0.0;
  for (int64_t i = 0; i < rows; ++i) s += losses[i];
  float value = static_cast<float>(s * scale);
  if (z_loss_weight != 0.0f) {
    double z = 0.0;
    for (int64_t r = 0; r < rows; ++r)
      if (targets[r] != ignore_index) z += static_cast<double>(lse[r]) * lse[r];
    value += static_cast<float>(z_loss_weight * z * scale);
  }
  out[0] = value;
}

void CpuBackend::z_loss_forward(float* losses, const float* lse, const std::int32_t* targets, int64_t rows,
                                std::int32_t ignore_index, float z_loss_weight) {
  for (int64_t r = 0; r < rows; ++r)
    if (targets[r] != ignore_index) losses[r] += z_loss_weight * lse[r] * lse[r];
}

void CpuBackend::z_loss_backward(float* logits, int64_t ld, const std::int32_t* targets, const float* lse,
                                 float grad_scale, float z_loss_weight, int64_t rows, int64_t vocab,
                                 std::int32_t ignore_index) {
  ex_.parallel_for(rows, row_grain(vocab), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      if (targets[r] == ignore_index) continue;
      const float twice = 2.0f * z_loss_weight * lse[r];
      float* row = logits + r * ld;
      const float factor = 1.0f + twice;
      for (int64_t j = 0; j < vocab; ++j) row[j] *= factor;
      row[targets[r]] += grad_scale * twice;
    }
  });
}

}  // namespace loom::cpu
