// Embedding lookup (and its scatter-add backward) and rotary position embeddings.
#include <cstring>

#include "cpu_backend.hpp"
#include "simd.hpp"

namespace loom::cpu {

void CpuBackend::embedding_forward(const float* table, const std::int32_t* ids, float* out, int64_t n, int64_t dim,
                                   int64_t /*vocab*/) {
  ex_.parallel_for(n, row_grain(dim), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      std::memcpy(out + i * dim, table + static_cast<int64_t>(ids[i]) * dim,
                  static_cast<std::size_t>(dim) * sizeof(float));
  });
}

void CpuBackend::embedding_backward(const std::int32_t* ids, const float* dout, float* dtable, int64_t n, int64_t dim,
                                    int64_t /*vocab*/) {
  // Threads own column blocks and walk every token in order, so repeated ids are summed in
  // increasing token order without atomics or per-thread copies of the table.
  const int64_t target = (dim + 4 * ex_.num_threads() - 1) / (4 * ex_.num_threads());
  const int64_t width = std::max<int64_t>(lanes, (target + lanes - 1) / lanes * lanes);
  const int64_t blocks = (dim + width - 1) / width;
  const int64_t grain = n * dim < options_.grain ? blocks : 1;
  ex_.parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    const int64_t c0 = b0 * width, c1 = std::min(dim, b1 * width);
    for (int64_t i = 0; i < n; ++i) {
      const float* g = dout + i * dim;
      float* t = dtable + static_cast<int64_t>(ids[i]) * dim;
      for (int64_t j = c0; j < c1; j += lanes) {
        const int64_t count = std::min<int64_t>(lanes, c1 - j);
        store_n(t + j, load_n(t + j, count) + load_n(g + j, count), count);
      }
    }
  });
}

void CpuBackend::rope(const float* x, int64_t x_batch_stride, int64_t x_token_stride, float* y, int64_t y_batch_stride,
                      int64_t y_token_stride, const float* cos, const float* sin, const std::int32_t* positions,
                      int64_t position_offset, int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                      bool interleaved, bool inverse, bool accumulate) {
  const int64_t half = head_dim / 2;
  const float sign = inverse ? -1.0f : 1.0f;
  ex_.parallel_for(batch * seq, row_grain(heads * head_dim), [&](int64_t t0, int64_t t1) {
    for (int64_t bt = t0; bt < t1; ++bt) {
      const int64_t b = bt / seq, t = bt % seq;
      const int64_t pos = positions ? positions[bt] : position_offset + t;
      const float* c = cos + pos * half;
      const float* s = sin + pos * half;
      const float* xt = x + b * x_batch_stride + t * x_token_stride;
      float* yt = y + b * y_batch_stride + t * y_token_stride;
      for (int64_t h = 0; h < heads; ++h) {
        const float* xh = xt + h * head_dim;
        float* yh = yt + h * head_dim;
        if (interleaved) {
          for (int64_t i = 0; i < half; ++i) {
            const float a = xh[2 * i], bv = xh[2 * i + 1], cv = c[i], sv = sign * s[i];
            const float ya = a * cv - bv * sv, yb = a * sv + bv * cv;
            yh[2 * i] = accumulate ? yh[2 * i] + ya : ya;
            yh[2 * i + 1] = accumulate ? yh[2 * i + 1] + yb : yb;
          }
          continue;
        }
        for (int64_t i = 0; i < half; i += lanes) {
          const int64_t count = std::min<int64_t>(lanes, half - i);
          const vf a = load_n(xh + i, count), bv = load_n(xh + half + i, count);
          const vf cv = load_n(c + i, count), sv = splat(sign) * load_n(s + i, count);
          vf ya = a * cv - bv * sv, yb = a * sv + bv * cv;
          if (accumulate) {
            ya += load_n(yh + i, count);
            yb += load_n(yh + half + i, count);
          }
          store_n(yh + i, ya, count);
          store_n(yh + half + i, yb, count);
        }
      }
    }
  });
}

}  // namespace loom::cpu
