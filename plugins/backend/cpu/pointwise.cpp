// Elementwise kernels and the GEMM epilogues (bias + activation), vectorised and parallel.
#include <loom/random.hpp>

#include "cpu_backend.hpp"
#include "simd.hpp"

namespace loom::cpu {

namespace {

vf activate(Activation act, vf x) {
  return act == Activation::gelu_tanh ? gelu(x) : silu(x);
}
vf activate_derivative(Activation act, vf x) {
  return act == Activation::gelu_tanh ? gelu_derivative(x) : silu_derivative(x);
}

// Calls f(i, count) for each vector of [begin, end): count is `lanes` except at the end.
template <class F>
inline void for_vectors(int64_t begin, int64_t end, F&& f) {
  for (int64_t i = begin; i < end; i += lanes) f(i, std::min<int64_t>(lanes, end - i));
}

// y (+)= v at y[i..i+count).
inline void put(float* y, int64_t i, int64_t count, vf v, bool accumulate) {
  if (accumulate) v += load_n(y + i, count);
  store_n(y + i, v, count);
}

}  // namespace

void CpuBackend::reduce_partials(const float* partials, int64_t chunks, int64_t stride, int64_t cols, float* out,
                                 bool accumulate) {
  ex_.parallel_for(cols, std::max<int64_t>(lanes, options_.grain / std::max<int64_t>(1, chunks)),
                   [&](int64_t begin, int64_t end) {
                     for_vectors(begin, end, [&](int64_t j, int64_t count) {
                       vf s = load_n(partials + j, count);
                       for (int64_t c = 1; c < chunks; ++c) s += load_n(partials + c * stride + j, count);
                       put(out, j, count, s, accumulate);
                     });
                   });
}

void bias_activation_rows(float* pre, const float* bias, float* out, int64_t r0, int64_t r1, int64_t cols,
                          Activation act) {
  for (int64_t r = r0; r < r1; ++r) {
    float* p = pre + r * cols;
    float* o = out ? out + r * cols : nullptr;
    for_vectors(0, cols, [&](int64_t j, int64_t count) {
      vf v = load_n(p + j, count);
      if (bias) {
        v += load_n(bias + j, count);
        store_n(p + j, v, count);
      }
      if (act != Activation::none) store_n(o + j, activate(act, v), count);
    });
  }
}

void CpuBackend::bias_activation_forward(float* pre, const float* bias, float* out, int64_t rows, int64_t cols,
                                         Activation act) {
  if (!bias && act == Activation::none) return;
  ex_.parallel_for(rows, row_grain(cols),
                   [&](int64_t r0, int64_t r1) { bias_activation_rows(pre, bias, out, r0, r1, cols, act); });
}

void CpuBackend::bias_activation_backward(const float* pre, const float* dout, float* dpre, float* dbias,
                                          bool accumulate_dbias, int64_t rows, int64_t cols, Activation act) {
  const bool write_dpre = act != Activation::none || dpre != dout;
  if (!dbias) {
    if (!write_dpre) return;
    ex_.parallel_for(rows * cols, options_.grain, [&](int64_t begin, int64_t end) {
      for_vectors(begin, end, [&](int64_t i, int64_t count) {
        vf d = load_n(dout + i, count);
        if (act != Activation::none) d *= activate_derivative(act, load_n(pre + i, count));
        store_n(dpre + i, d, count);
      });
    });
    return;
  }
  // Column sums by fixed row chunks, then in chunk order: independent of the thread count.
  const int64_t per_chunk = rows_per_chunk(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
  float* partials = scratch(static_cast<std::size_t>(chunks * cols));
  ex_.parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* part = partials + c * cols;
      std::fill_n(part, cols, 0.0f);
      const int64_t r1 = std::min(rows, (c + 1) * per_chunk);
      for (int64_t r = c * per_chunk; r < r1; ++r) {
        const int64_t base = r * cols;
        for_vectors(0, cols, [&](int64_t j, int64_t count) {
          vf d = load_n(dout + base + j, count);
          if (act != Activation::none) d *= activate_derivative(act, load_n(pre + base + j, count));
          if (write_dpre) store_n(dpre + base + j, d, count);
          store_n(part + j, load_n(part + j, count) + d, count);
        });
      }
    }
  });
  reduce_partials(partials, chunks, cols, cols, dbias, accumulate_dbias);
}

void CpuBackend::activation_forward(Activation act, const float* x, float* y, int64_t n) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end,
                [&](int64_t i, int64_t count) { store_n(y + i, activate(act, load_n(x + i, count)), count); });
  });
}

void CpuBackend::activation_backward(Activation act, const float* x, const float* dy, float* dx, int64_t n,
                                     bool accumulate) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end, [&](int64_t i, int64_t count) {
      put(dx, i, count, load_n(dy + i, count) * activate_derivative(act, load_n(x + i, count)), accumulate);
    });
  });
}

void CpuBackend::swiglu_forward(const float* gate, const float* up, float* y, int64_t n) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end, [&](int64_t i, int64_t count) {
      store_n(y + i, silu(load_n(gate + i, count)) * load_n(up + i, count), count);
    });
  });
}

void CpuBackend::swiglu_backward(const float* gate, const float* up, const float* dy, float* dgate,
                                 bool accumulate_dgate, float* dup, bool accumulate_dup, int64_t n) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end, [&](int64_t i, int64_t count) {
      const vf g = load_n(gate + i, count), u = load_n(up + i, count), d = load_n(dy + i, count);
      const vf s = sigmoid(g);
      if (dgate) put(dgate, i, count, d * u * (s * (splat(1.0f) + g * (splat(1.0f) - s))), accumulate_dgate);
      if (dup) put(dup, i, count, d * (g * s), accumulate_dup);
    });
  });
}

void CpuBackend::add(const float* a, const float* b, float* y, int64_t n) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end,
                [&](int64_t i, int64_t count) { store_n(y + i, load_n(a + i, count) + load_n(b + i, count), count); });
  });
}

void CpuBackend::scale(const float* x, float alpha, float* y, int64_t n, bool accumulate) {
  const vf va = splat(alpha);
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    if (alpha == 1.0f && !accumulate) {
      std::memmove(y + begin, x + begin, static_cast<std::size_t>(end - begin) * sizeof(float));
      return;
    }
    for_vectors(begin, end, [&](int64_t i, int64_t count) { put(y, i, count, va * load_n(x + i, count), accumulate); });
  });
}

void CpuBackend::fill(float* y, float value, int64_t n) {
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) { std::fill(y + begin, y + end, value); });
}

void CpuBackend::dropout(const float* x, float* y, int64_t n, float p, std::uint64_t key, bool accumulate) {
  const vu threshold = splat_u(dropout_threshold(p));
  const vf scale_v = splat(dropout_scale(p));
  const vu key_lo = splat_u(static_cast<std::uint32_t>(key)), key_hi = splat_u(static_cast<std::uint32_t>(key >> 32));
  const vu iota = iota_u();
  ex_.parallel_for(n, options_.grain, [&](int64_t begin, int64_t end) {
    for_vectors(begin, end, [&](int64_t i, int64_t count) {
      const vu bits = hash_u32((splat_u(static_cast<std::uint32_t>(i)) + iota) ^ key_lo) ^ key_hi;
      const vf v = load_n(x + i, count) * scale_v;
      put(y, i, count, bits >= threshold ? v : splat(0.0f), accumulate);
    });
  });
}

}  // namespace loom::cpu
