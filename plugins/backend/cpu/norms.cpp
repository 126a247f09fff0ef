// LayerNorm and RMSNorm: one row at a time (a row stays in L1 between its passes), rows in
// parallel; parameter gradients as per-chunk partial sums reduced in chunk order.
#include <cmath>

#include "cpu_backend.hpp"
#include "simd.hpp"

namespace loom::cpu {

namespace {

template <class F>
inline void for_vectors(int64_t n, F&& f) {
  for (int64_t i = 0; i < n; i += lanes) f(i, std::min<int64_t>(lanes, n - i));
}

inline vf weight_or_one(const float* w, int64_t j, int64_t count) {
  return w ? load_n(w + j, count) : splat(1.0f);
}

// Normalises one row: y = (x - mu) * rs * w + b (mu = 0 for RMSNorm).
inline void normalise_row(const float* x, const float* w, const float* b, float* y, int64_t cols, float mu, float rs) {
  const vf vmu = splat(mu), vrs = splat(rs);
  for_vectors(cols, [&](int64_t j, int64_t count) {
    vf v = (load_n(x + j, count) - vmu) * vrs * weight_or_one(w, j, count);
    if (b) v += load_n(b + j, count);
    store_n(y + j, v, count);
  });
}

inline void layer_norm_row(const float* x, const float* w, const float* b, float* y, float* mean, float* rstd,
                           int64_t cols, float eps) {
  vf s = splat(0.0f);
  for_vectors(cols, [&](int64_t j, int64_t count) { s += load_n(x + j, count); });
  const float mu = hsum(s) / static_cast<float>(cols);
  vf q = splat(0.0f);
  const vf vmu = splat(mu);
  for_vectors(cols, [&](int64_t j, int64_t count) {
    const vf d = load_n(x + j, count, mu) - vmu;
    q += d * d;
  });
  const float rs = 1.0f / std::sqrt(hsum(q) / static_cast<float>(cols) + eps);
  *mean = mu;
  *rstd = rs;
  normalise_row(x, w, b, y, cols, mu, rs);
}

inline void rms_norm_row(const float* x, const float* w, float* y, float* rstd, int64_t cols, float eps) {
  vf q = splat(0.0f);
  for_vectors(cols, [&](int64_t j, int64_t count) {
    const vf v = load_n(x + j, count);
    q += v * v;
  });
  const float rs = 1.0f / std::sqrt(hsum(q) / static_cast<float>(cols) + eps);
  *rstd = rs;
  normalise_row(x, w, nullptr, y, cols, 0.0f, rs);
}

inline void add_row(const float* a, const float* b, float* sum, int64_t cols) {
  for_vectors(cols,
              [&](int64_t j, int64_t count) { store_n(sum + j, load_n(a + j, count) + load_n(b + j, count), count); });
}

}  // namespace

void CpuBackend::layer_norm_forward(const float* x, const float* weight, const float* bias, float* y, float* mean,
                                    float* rstd, int64_t rows, int64_t cols, float eps) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      layer_norm_row(x + r * cols, weight, bias, y + r * cols, mean + r, rstd + r, cols, eps);
  });
}

void CpuBackend::add_layer_norm_forward(const float* a, const float* b, float* sum, const float* weight,
                                        const float* bias, float* y, float* mean, float* rstd, int64_t rows,
                                        int64_t cols, float eps) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* s = sum + r * cols;
      add_row(a + r * cols, b + r * cols, s, cols);
      layer_norm_row(s, weight, bias, y + r * cols, mean + r, rstd + r, cols, eps);
    }
  });
}

void CpuBackend::rms_norm_forward(const float* x, const float* weight, float* y, float* rstd, int64_t rows,
                                  int64_t cols, float eps) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) rms_norm_row(x + r * cols, weight, y + r * cols, rstd + r, cols, eps);
  });
}

void CpuBackend::add_rms_norm_forward(const float* a, const float* b, float* sum, const float* weight, float* y,
                                      float* rstd, int64_t rows, int64_t cols, float eps) {
  ex_.parallel_for(rows, row_grain(cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* s = sum + r * cols;
      add_row(a + r * cols, b + r * cols, s, cols);
      rms_norm_row(s, weight, y + r * cols, rstd + r, cols, eps);
    }
  });
}

void CpuBackend::layer_norm_backward(const float* x, const float* weight, const float* mean, const float* rstd,
                                     const float* dy, float* dx, bool accumulate_dx, float* dweight,
                                     bool accumulate_dweight, float* dbias, bool accumulate_dbias, int64_t rows,
                                     int64_t cols) {
  const bool params = dweight || dbias;
  const int64_t per_chunk = rows_per_chunk(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
  // Per chunk: [dweight partial | dbias partial].
  float* partials = params ? scratch(static_cast<std::size_t>(chunks * 2 * cols)) : nullptr;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  ex_.parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* pw = params ? partials + c * 2 * cols : nullptr;
      float* pb = params ? pw + cols : nullptr;
      if (params) std::fill_n(pw, 2 * cols, 0.0f);
      const int64_t r1 = std::min(rows, (c + 1) * per_chunk);
      for (int64_t r = c * per_chunk; r < r1; ++r) {
        const float* xr = x + r * cols;
        const float* gr = dy + r * cols;
        const vf vmu = splat(mean[r]), vrs = splat(rstd[r]);
        vf sg = splat(0.0f), sgx = splat(0.0f);
        for_vectors(cols, [&](int64_t j, int64_t count) {
          const vf xhat = (load_n(xr + j, count, mean[r]) - vmu) * vrs;
          const vf d = load_n(gr + j, count);
          const vf g = d * weight_or_one(weight, j, count);
          sg += g;
          sgx += g * xhat;
          if (params) {
            store_n(pw + j, load_n(pw + j, count) + d * xhat, count);
            store_n(pb + j, load_n(pb + j, count) + d, count);
          }
        });
        if (!dx) continue;
        const vf mg = splat(hsum(sg) * inv_cols), mgx = splat(hsum(sgx) * inv_cols);
        float* out = dx + r * cols;
        for_vectors(cols, [&](int64_t j, int64_t count) {
          const vf xhat = (load_n(xr + j, count) - vmu) * vrs;
          const vf g = load_n(gr + j, count) * weight_or_one(weight, j, count);
          vf v = vrs * (g - mg - xhat * mgx);
          if (accumulate_dx) v += load_n(out + j, count);
          store_n(out + j, v, count);
        });
      }
    }
  });
  if (!params) return;
  // Reduce both halves of every chunk's partials in chunk order.
  if (dweight) reduce_partials(partials, chunks, 2 * cols, cols, dweight, accumulate_dweight);
  if (dbias) reduce_partials(partials + cols, chunks, 2 * cols, cols, dbias, accumulate_dbias);
}

void CpuBackend::rms_norm_backward(const float* x, const float* weight, const float* rstd, const float* dy, float* dx,
                                   bool accumulate_dx, float* dweight, bool accumulate_dweight, int64_t rows,
                                   int64_t cols) {
  const int64_t per_chunk = rows_per_chunk(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + per_chunk - 1) / per_chunk);
  float* partials = dweight ? scratch(static_cast<std::size_t>(chunks * cols)) : nullptr;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  ex_.parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* pw = dweight ? partials + c * cols : nullptr;
      if (pw) std::fill_n(pw, cols, 0.0f);
      const int64_t r1 = std::min(rows, (c + 1) * per_chunk);
      for (int64_t r = c * per_chunk; r < r1; ++r) {
        const float* xr = x + r * cols;
        const float* gr = dy + r * cols;
        const vf vrs = splat(rstd[r]);
        vf sgx = splat(0.0f);
        for_vectors(cols, [&](int64_t j, int64_t count) {
          const vf xhat = load_n(xr + j, count) * vrs;
          const vf d = load_n(gr + j, count);
          sgx += d * weight_or_one(weight, j, count) * xhat;
          if (pw) store_n(pw + j, load_n(pw + j, count) + d * xhat, count);
        });
        if (!dx) continue;
        const vf mgx = splat(hsum(sgx) * inv_cols);
        float* out = dx + r * cols;
        for_vectors(cols, [&](int64_t j, int64_t count) {
          const vf xhat = load_n(xr + j, count) * vrs;
          const vf g = load_n(gr + j, count) * weight_or_one(weight, j, count);
          vf v = vrs * (g - xhat * mgx);
          if (accumulate_dx) v += load_n(out + j, count);
          store_n(out + j, v, count);
        });
      }
    }
  });
  if (dweight) reduce_partials(partials, chunks, cols, cols, dweight, accumulate_dweight);
}

}  // namespace loom::cpu
