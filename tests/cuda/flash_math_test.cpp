// The GPU flash-attention kernel's arithmetic on the host (plugins/attention/cuda-flash/
// flash_math.hpp): the LOOM_HOST_DEVICE functions flash_kernels.cu calls per score, per row and
// per operand, compiled here by the C++ compiler. Each is checked against the SDK's rule
// (loom::AttentionMask, which the `naive` kernel uses), against its definition, or against
// loom's bf16 rounding; and the kernels' tile algorithm (the same tiles and tile skipping, the
// same online softmax, the same recomputing backward with the dK/dV and dQ passes, float32 or
// with the bf16 roundings of the tensor-core path) is run on the host with these functions and
// compared with `naive` on problems with every feature: causal and bidirectional, sliding
// windows, soft-caps, GQA/MQA, a KV cache (q_len < kv_len), packed documents with rows that see
// no key. A machine without a GPU tests here what the GPU computes, but for the GPU's own
// expf/tanhf/logf (a few ulp) and its summation order.
#include "flash_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <loom/attention_mask.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/tensor.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

namespace fm = loom::cuda_flash;
using std::int64_t;

constexpr float inf = std::numeric_limits<float>::infinity();

// ---- Per-element functions.

TEST(CudaFlashMath, MaskIsTheSdksRule) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> id(0, 2);
  for (const bool causal : {true, false})
    for (const int64_t window : {0, 1, 2, 3, 5})
      for (const int64_t q_len : {1, 4, 7})
        for (const int64_t extra : {0, 3}) {
          const int64_t kv_len = q_len + extra;
          std::vector<std::int32_t> q_ids(static_cast<size_t>(q_len)), kv_ids(static_cast<size_t>(kv_len));
          for (auto& x : q_ids) x = id(rng);
          for (auto& x : kv_ids) x = id(rng);
          for (const bool segments : {false, true}) {
            AttentionForwardArgs a;
            a.batch = 1;
            a.q_len = q_len;
            a.kv_len = kv_len;
            a.params.causal = causal;
            a.params.window = window;
            a.q_segments = segments ? q_ids.data() : nullptr;
            a.kv_segments = segments ? kv_ids.data() : nullptr;
            const AttentionMask mask(a);
            const fm::MaskRule rule{kv_len - q_len, window, causal};
            for (int64_t i = 0; i < q_len; ++i)
              for (int64_t j = 0; j < kv_len; ++j)
                ASSERT_EQ(
                    fm::visible(rule, i, j, segments, q_ids[static_cast<size_t>(i)], kv_ids[static_cast<size_t>(j)]),
                    mask.visible(0, i, j))
                    << "causal " << causal << ", window " << window << ", q_len " << q_len << ", kv_len " << kv_len
                    << ", segments " << segments << ", i " << i << ", j " << j;
          }
        }
}

TEST(CudaFlashMath, TileSkippingHidesExactlyTheTilesNoRowSees) {
  for (const bool causal : {true, false})
    for (const int64_t window : {0, 1, 2, 4})
      for (const int64_t extra : {0, 2}) {
        const int64_t q_len = 9, kv_len = q_len + extra;
        AttentionForwardArgs a;
        a.batch = 1;
        a.q_len = q_len;
        a.kv_len = kv_len;
        a.params.causal = causal;
        a.params.window = window;
        const AttentionMask mask(a);
        const fm::MaskRule rule{extra, window, causal};
        for (int64_t i0 = 0; i0 < q_len; ++i0)
          for (int64_t i1 = i0 + 1; i1 <= q_len; ++i1)
            for (int64_t j0 = 0; j0 < kv_len; ++j0)
              for (int64_t j1 = j0 + 1; j1 <= kv_len; ++j1) {
                bool any = false;
                for (int64_t i = i0; i < i1; ++i)
                  for (int64_t j = j0; j < j1; ++j) any = any || fm::visible_by_position(rule, i, j);
                const bool hidden = fm::tile_hidden(rule, i0, i1, j0, j1);
                ASSERT_EQ(hidden, !any) << "causal " << causal << ", window " << window << ", rows [" << i0 << ", "
                                        << i1 << "), keys [" << j0 << ", " << j1 << ")";
                ASSERT_EQ(hidden, mask.cover(0, i0, i1, j0, j1) == MaskCover::none);
              }
      }
}

TEST(CudaFlashMath, SoftcapAndItsDerivative) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 20.0f);
  for (const float cap : {0.5f, 5.0f, 30.0f, 50.0f})
    for (int n = 0; n < 2000; ++n) {
      const float s = normal(rng);
      const float capped = fm::softcap(s, cap);
      EXPECT_NEAR(capped, cap * std::tanh(s / cap), 1e-6 * cap) << s << " capped at " << cap;
      EXPECT_LE(std::fabs(capped), cap);
      // d/ds of cap tanh(s / cap), by central differences in float64.
      const double h = 1e-4 * cap;
      const double numeric =
          (cap * std::tanh((double{s} + h) / cap) - cap * std::tanh((double{s} - h) / cap)) / (2.0 * h);
      EXPECT_NEAR(fm::softcap_derivative(capped, cap), numeric, 2e-5) << s << " capped at " << cap;
    }
  // No cap: the identity, derivative 1.
  EXPECT_EQ(fm::softcap(3.5f, 0.0f), 3.5f);
  EXPECT_EQ(fm::softcap_derivative(3.5f, 0.0f), 1.0f);
}

TEST(CudaFlashMath, OnlineSoftmaxEqualsTheDirectOne) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  std::uniform_int_distribution<int> tile(1, 9), hide(0, 3);
  for (int trial = 0; trial < 500; ++trial) {
    const int n = 1 + trial % 60;
    std::vector<float> s(static_cast<size_t>(n)), v(static_cast<size_t>(n));
    for (int j = 0; j < n; ++j) {
      s[static_cast<size_t>(j)] = hide(rng) == 0 ? -inf : normal(rng);
      v[static_cast<size_t>(j)] = normal(rng);
    }
    // Streamed in tiles of random widths, as the kernel does (out as one value column).
    float max = -inf, sum = 0.0f, out = 0.0f;
    for (int j0 = 0; j0 < n;) {
      const int j1 = std::min(n, j0 + tile(rng));
      float tile_max = -inf;
      for (int j = j0; j < j1; ++j) tile_max = std::max(tile_max, s[static_cast<size_t>(j)]);
      const float new_max = fm::online_max(max, tile_max);
      const float factor = fm::rescale(max, new_max);
      float tile_sum = 0.0f, tile_out = 0.0f;
      for (int j = j0; j < j1; ++j) {
        const float p = fm::shifted_exp(s[static_cast<size_t>(j)], new_max);
        tile_sum += p;
        tile_out += p * v[static_cast<size_t>(j)];
      }
      out = out * factor + tile_out;
      sum = sum * factor + tile_sum;
      max = new_max;
      j0 = j1;
    }
    const fm::RowEnd end = fm::finish_row(max, sum);
    // Directly, in float64.
    double m = -INFINITY;
    for (float x : s) m = std::max(m, double{x});
    if (m == -INFINITY) {
      EXPECT_EQ(end.lse, -inf);
      EXPECT_EQ(out * end.out_scale, 0.0f);
      continue;
    }
    double z = 0.0, weighted = 0.0;
    for (int j = 0; j < n; ++j) {
      const double e = s[static_cast<size_t>(j)] == -inf ? 0.0 : std::exp(double{s[static_cast<size_t>(j)]} - m);
      z += e;
      weighted += e * v[static_cast<size_t>(j)];
    }
    EXPECT_NEAR(end.lse, m + std::log(z), 1e-5 * (1.0 + std::fabs(m))) << "trial " << trial;
    EXPECT_NEAR(out * end.out_scale, weighted / z, 2e-5 * 16.0) << "trial " << trial;
    // The backward's recomputed probabilities sum to one.
    double total = 0.0;
    for (float x : s) total += fm::probability(x, end.lse, x != -inf);
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
}

TEST(CudaFlashMath, Bf16RoundingIsLoomsNearestEven) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, -1.0f, inf, -inf, std::nanf(""), 1e-40f, -3e38f, 3.4e38f};
  // Ties: 1 + 2^-8 (rounds down to even), 1 + 3 * 2^-8 (rounds up to even), and their neighbours.
  for (const float t : {1.00390625f, 1.01171875f}) {
    xs.push_back(t);
    xs.push_back(std::nextafter(t, 0.0f));
    xs.push_back(std::nextafter(t, 2.0f));
  }
  for (int n = 0; n < 20000; ++n) xs.push_back(normal(rng));
  for (const float x : xs) {
    const std::uint16_t got = fm::bf16_bits(x), want = to_bfloat16(x).bits;
    ASSERT_EQ(got, want) << x;
    const float value = fm::bf16_value(x);
    if (std::isnan(x))
      EXPECT_TRUE(std::isnan(value));
    else
      EXPECT_EQ(value, to_float(to_bfloat16(x))) << x;
  }
  EXPECT_EQ(fm::bf16_value(1.00390625f), 1.0f);
  EXPECT_EQ(fm::bf16_value(1.01171875f), 1.015625f);
}

TEST(CudaFlashMath, HeadDimsAndTilesFitTheKernels) {
  EXPECT_EQ(fm::padded_head_dim(1), 64);
  EXPECT_EQ(fm::padded_head_dim(64), 64);
  EXPECT_EQ(fm::padded_head_dim(65), 128);
  EXPECT_EQ(fm::padded_head_dim(128), 128);
  EXPECT_EQ(fm::padded_head_dim(256), 256);
  EXPECT_EQ(fm::padded_head_dim(257), 0);
  for (const int64_t d : {64, 128, 256})
    for (const bool bf16 : {false, true}) {
      EXPECT_EQ(fm::forward_tile(d, bf16) % 16, 0);  // WMMA's 16 x 16 fragments
      EXPECT_EQ(fm::backward_tile(d, bf16) % 16, 0);
    }
}

// ---- The kernels' tile algorithm on the host, with the functions above.

struct Case {
  int64_t batch, q_len, kv_len, q_heads, kv_heads, head_dim;
  bool causal;
  int64_t window;
  float softcap;
  bool segments;
  std::string str() const {
    std::ostringstream s;
    s << "batch " << batch << ", q_len " << q_len << ", kv_len " << kv_len << ", heads " << q_heads << "/" << kv_heads
      << ", head_dim " << head_dim << (causal ? ", causal" : ", bidirectional") << ", window " << window << ", softcap "
      << softcap << (segments ? ", segments" : "");
    return s.str();
  }
};

struct Data {
  std::vector<float> q, k, v, dout;
  std::vector<std::int32_t> q_seg, kv_seg;
};

struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

Data make_data(const Case& c, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Data d;
  d.q.resize(static_cast<size_t>(c.batch * c.q_len * c.q_heads * c.head_dim));
  d.k.resize(static_cast<size_t>(c.batch * c.kv_len * c.kv_heads * c.head_dim));
  d.v.resize(d.k.size());
  d.dout.resize(d.q.size());
  for (auto* x : {&d.q, &d.k, &d.v, &d.dout})
    for (float& e : *x) e = normal(rng);
  if (c.segments) {
    std::uniform_int_distribution<int> boundary(0, 4);
    for (int64_t b = 0; b < c.batch; ++b) {
      std::int32_t id = 0;
      for (int64_t j = 0; j < c.kv_len; ++j) {
        if (j > 0 && boundary(rng) == 0) ++id;
        d.kv_seg.push_back(id);
      }
      for (int64_t i = 0; i < c.q_len; ++i) {
        std::int32_t s = d.kv_seg[static_cast<size_t>(b * c.kv_len + c.kv_len - c.q_len + i)];
        if (boundary(rng) == 0 && boundary(rng) == 0) s = 1000;  // a row that sees no key
        d.q_seg.push_back(s);
      }
    }
  }
  return d;
}

AttentionForwardArgs args_of(const Case& c, const Data& d) {
  AttentionForwardArgs a;
  a.batch = c.batch;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.q_heads = c.q_heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.q = {d.q.data(), c.q_len * c.q_heads * c.head_dim, c.q_heads * c.head_dim};
  a.k = {d.k.data(), c.kv_len * c.kv_heads * c.head_dim, c.kv_heads * c.head_dim};
  a.v = {d.v.data(), c.kv_len * c.kv_heads * c.head_dim, c.kv_heads * c.head_dim};
  a.q_segments = c.segments ? d.q_seg.data() : nullptr;
  a.kv_segments = c.segments ? d.kv_seg.data() : nullptr;
  a.params.causal = c.causal;
  a.params.window = c.window;
  a.params.softcap = c.softcap;
  a.params.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return a;
}

Results run_naive(const Case& c, const Data& d) {
  Handle<AttentionKernel> naive = make_attention("naive");
  Results r;
  r.out.assign(d.q.size(), 0.0f);
  r.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 0.0f);
  r.dq.assign(d.q.size(), 0.0f);
  r.dk.assign(d.k.size(), 0.0f);
  r.dv.assign(d.v.size(), 0.0f);
  AttentionForwardArgs a = args_of(c, d);
  a.out = r.out.data();
  a.lse = r.lse.data();
  naive->forward(a);
  AttentionBackwardArgs b;
  b.forward = &a;
  b.dout = d.dout.data();
  b.dq = {r.dq.data(), a.q.batch_stride, a.q.token_stride, false};
  b.dk = {r.dk.data(), a.k.batch_stride, a.k.token_stride, false};
  b.dv = {r.dv.data(), a.v.batch_stride, a.v.token_stride, false};
  naive->backward(b);
  return r;
}

// flash_kernels.cu's algorithm: tiles of `tile` rows and keys, hidden tiles skipped, every score
// through visible / softcap, the online softmax through online_max / rescale / shifted_exp /
// finish_row; backward: delta, then per tile pair probability and score_gradient, dV += P^T dO,
// dK += scale dS^T Q (the dK/dV pass) and dQ += scale dS K (the dQ pass). With bf16, the operands
// of every product are rounded by bf16_value where the kernel stores them as bf16.
Results run_tiled(const Case& c, const Data& d, int64_t tile, bool bf16) {
  const int64_t hd = c.head_dim, group = c.q_heads / c.kv_heads;
  const fm::MaskRule rule{c.kv_len - c.q_len, c.window, c.causal};
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto round = [bf16](float x) { return bf16 ? fm::bf16_value(x) : x; };
  auto q_at = [&](int64_t b, int64_t i, int64_t h, int64_t e) {
    return round(d.q[static_cast<size_t>(((b * c.q_len + i) * c.q_heads + h) * hd + e)]);
  };
  auto kv_at = [&](const std::vector<float>& x, int64_t b, int64_t j, int64_t g, int64_t e) {
    return round(x[static_cast<size_t>(((b * c.kv_len + j) * c.kv_heads + g) * hd + e)]);
  };
  auto dout_at = [&](int64_t b, int64_t i, int64_t h, int64_t e) {
    return round(d.dout[static_cast<size_t>(((b * c.q_len + i) * c.q_heads + h) * hd + e)]);
  };
  auto seen = [&](int64_t b, int64_t i, int64_t j) {
    return fm::visible(rule, i, j, c.segments, c.segments ? d.q_seg[static_cast<size_t>(b * c.q_len + i)] : 0,
                       c.segments ? d.kv_seg[static_cast<size_t>(b * c.kv_len + j)] : 0);
  };
  Results r;
  r.out.assign(d.q.size(), 0.0f);
  r.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 0.0f);
  r.dq.assign(d.q.size(), 0.0f);
  r.dk.assign(d.k.size(), 0.0f);
  r.dv.assign(d.v.size(), 0.0f);
  const int64_t q_tiles = (c.q_len + tile - 1) / tile, kv_tiles = (c.kv_len + tile - 1) / tile;
  std::vector<float> s(static_cast<size_t>(tile * tile)), dp(s.size());

  // Forward: one (batch, head, query tile) at a time.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        const int64_t g = h / group, i0 = qt * tile, count = std::min(tile, c.q_len - i0);
        std::vector<float> o(static_cast<size_t>(tile * hd), 0.0f), max(static_cast<size_t>(tile), -inf),
            sum(static_cast<size_t>(tile), 0.0f);
        for (int64_t kt = 0; kt < kv_tiles; ++kt) {
          const int64_t j0 = kt * tile, cols = std::min(tile, c.kv_len - j0);
          if (fm::tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
          for (int64_t rr = 0; rr < count; ++rr) {
            float tile_max = -inf;
            for (int64_t cc = 0; cc < cols; ++cc) {
              float dot = 0.0f;
              for (int64_t e = 0; e < hd; ++e) dot += q_at(b, i0 + rr, h, e) * kv_at(d.k, b, j0 + cc, g, e);
              const float x = seen(b, i0 + rr, j0 + cc) ? fm::softcap(scale * dot, c.softcap) : -inf;
              s[static_cast<size_t>(rr * tile + cc)] = x;
              tile_max = std::max(tile_max, x);
            }
            const float new_max = fm::online_max(max[static_cast<size_t>(rr)], tile_max);
            const float factor = fm::rescale(max[static_cast<size_t>(rr)], new_max);
            float tile_sum = 0.0f;
            for (int64_t cc = 0; cc < cols; ++cc) {
              const float p = fm::shifted_exp(s[static_cast<size_t>(rr * tile + cc)], new_max);
              tile_sum += p;
              s[static_cast<size_t>(rr * tile + cc)] = round(p);
            }
            for (int64_t e = 0; e < hd; ++e) o[static_cast<size_t>(rr * hd + e)] *= factor;
            sum[static_cast<size_t>(rr)] = sum[static_cast<size_t>(rr)] * factor + tile_sum;
            max[static_cast<size_t>(rr)] = new_max;
            for (int64_t e = 0; e < hd; ++e) {
              float acc = 0.0f;
              for (int64_t cc = 0; cc < cols; ++cc)
                acc += s[static_cast<size_t>(rr * tile + cc)] * kv_at(d.v, b, j0 + cc, g, e);
              o[static_cast<size_t>(rr * hd + e)] += acc;
            }
          }
        }
        for (int64_t rr = 0; rr < count; ++rr) {
          const fm::RowEnd end = fm::finish_row(max[static_cast<size_t>(rr)], sum[static_cast<size_t>(rr)]);
          for (int64_t e = 0; e < hd; ++e)
            r.out[static_cast<size_t>(((b * c.q_len + i0 + rr) * c.q_heads + h) * hd + e)] =
                o[static_cast<size_t>(rr * hd + e)] * end.out_scale;
          r.lse[static_cast<size_t>((b * c.q_heads + h) * c.q_len + i0 + rr)] = end.lse;
        }
      }

  // delta = rowsum(dO * O), dO as the products see it.
  std::vector<float> delta(r.lse.size());
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t i = 0; i < c.q_len; ++i) {
        float acc = 0.0f;
        for (int64_t e = 0; e < hd; ++e)
          acc += dout_at(b, i, h, e) * r.out[static_cast<size_t>(((b * c.q_len + i) * c.q_heads + h) * hd + e)];
        delta[static_cast<size_t>((b * c.q_heads + h) * c.q_len + i)] = acc;
      }

  // One tile pair: S, dP, then P and dS into s and dp (P and dS rounded as the kernel stores them).
  auto pair = [&](int64_t b, int64_t h, int64_t g, int64_t i0, int64_t count, int64_t j0, int64_t cols) {
    for (int64_t rr = 0; rr < count; ++rr)
      for (int64_t cc = 0; cc < cols; ++cc) {
        float dot = 0.0f, dpv = 0.0f;
        for (int64_t e = 0; e < hd; ++e) {
          dot += q_at(b, i0 + rr, h, e) * kv_at(d.k, b, j0 + cc, g, e);
          dpv += dout_at(b, i0 + rr, h, e) * kv_at(d.v, b, j0 + cc, g, e);
        }
        const float capped = fm::softcap(scale * dot, c.softcap);
        const size_t row = static_cast<size_t>((b * c.q_heads + h) * c.q_len + i0 + rr);
        const float p = fm::probability(capped, r.lse[row], seen(b, i0 + rr, j0 + cc));
        s[static_cast<size_t>(rr * tile + cc)] = round(p);
        dp[static_cast<size_t>(rr * tile + cc)] = round(fm::score_gradient(p, dpv, delta[row], capped, c.softcap));
      }
  };
  // The dK/dV pass: per key tile, every query tile of every head of the group.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t g = 0; g < c.kv_heads; ++g)
      for (int64_t kt = 0; kt < kv_tiles; ++kt) {
        const int64_t j0 = kt * tile, cols = std::min(tile, c.kv_len - j0);
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
          for (int64_t qt = 0; qt < q_tiles; ++qt) {
            const int64_t i0 = qt * tile, count = std::min(tile, c.q_len - i0);
            if (fm::tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
            pair(b, h, g, i0, count, j0, cols);
            for (int64_t cc = 0; cc < cols; ++cc)
              for (int64_t e = 0; e < hd; ++e) {
                float acc_v = 0.0f, acc_k = 0.0f;
                for (int64_t rr = 0; rr < count; ++rr) {
                  acc_v += s[static_cast<size_t>(rr * tile + cc)] * dout_at(b, i0 + rr, h, e);
                  acc_k += dp[static_cast<size_t>(rr * tile + cc)] * q_at(b, i0 + rr, h, e);
                }
                const size_t at = static_cast<size_t>(((b * c.kv_len + j0 + cc) * c.kv_heads + g) * hd + e);
                r.dv[at] += acc_v;
                r.dk[at] += scale * acc_k;
              }
          }
      }
  // The dQ pass: per query tile, every key tile.
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h)
      for (int64_t qt = 0; qt < q_tiles; ++qt) {
        const int64_t g = h / group, i0 = qt * tile, count = std::min(tile, c.q_len - i0);
        for (int64_t kt = 0; kt < kv_tiles; ++kt) {
          const int64_t j0 = kt * tile, cols = std::min(tile, c.kv_len - j0);
          if (fm::tile_hidden(rule, i0, i0 + count, j0, j0 + cols)) continue;
          pair(b, h, g, i0, count, j0, cols);
          for (int64_t rr = 0; rr < count; ++rr)
            for (int64_t e = 0; e < hd; ++e) {
              float acc = 0.0f;
              for (int64_t cc = 0; cc < cols; ++cc)
                acc += dp[static_cast<size_t>(rr * tile + cc)] * kv_at(d.k, b, j0 + cc, g, e);
              r.dq[static_cast<size_t>(((b * c.q_len + i0 + rr) * c.q_heads + h) * hd + e)] += scale * acc;
            }
        }
      }
  return r;
}

// Largest |a - b| relative to the largest finite |b| (at least 0.1); -inf must match exactly.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0.1, worst = 0.0;
  for (float x : b)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(double{x}));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    if (std::isnan(a[i]) || std::isnan(b[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double{a[i]} - double{b[i]}) / scale);
  }
  return worst;
}

std::vector<Case> cases() {
  std::vector<Case> all = {
      {1, 13, 13, 2, 2, 8, true, 0, 0.0f, false},   // causal, several tiles
      {2, 11, 11, 2, 1, 7, false, 0, 0.0f, false},  // bidirectional MQA, odd head_dim
      {1, 17, 17, 4, 2, 16, true, 5, 0.0f, false},  // sliding window, GQA
      {1, 10, 10, 2, 2, 8, false, 3, 0.0f, false},  // window, bidirectional
      {1, 12, 12, 2, 2, 8, true, 0, 2.0f, false},   // soft-cap (small cap: strong derivative)
      {2, 15, 15, 2, 1, 8, true, 0, 0.0f, true},    // packed documents, rows that see no key
      {1, 5, 14, 3, 1, 8, true, 4, 3.0f, false},    // KV cache, window, cap
      {2, 19, 19, 4, 2, 12, false, 6, 4.0f, true},  // everything
      {1, 1, 9, 2, 2, 8, true, 0, 0.0f, false},     // one decoding step
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> len(1, 24), pick(0, 3);
  for (int n = 0; n < 16; ++n) {
    Case c{};
    c.batch = 1 + pick(rng) % 2;
    c.kv_len = len(rng);
    c.q_len = std::max<int64_t>(1, c.kv_len - pick(rng) * 2);
    c.kv_heads = 1 + pick(rng) % 2;
    c.q_heads = c.kv_heads * (1 + pick(rng) % 3);
    c.head_dim = std::vector<int64_t>{1, 5, 8, 16}[static_cast<size_t>(pick(rng))];
    c.causal = pick(rng) != 0;
    c.window = pick(rng) == 0 ? 1 + pick(rng) * 3 : 0;
    c.softcap = pick(rng) == 0 ? 1.5f + static_cast<float>(pick(rng)) : 0.0f;
    c.segments = pick(rng) == 0;
    all.push_back(c);
  }
  return all;
}

void expect_close(const Results& got, const Results& want, double out_limit, double grad_limit,
                  const std::string& what) {
  EXPECT_LE(relative_error(got.out, want.out), out_limit) << "out, " << what;
  EXPECT_LE(relative_error(got.lse, want.lse), out_limit) << "lse, " << what;
  EXPECT_LE(relative_error(got.dq, want.dq), grad_limit) << "dq, " << what;
  EXPECT_LE(relative_error(got.dk, want.dk), grad_limit) << "dk, " << what;
  EXPECT_LE(relative_error(got.dv, want.dv), grad_limit) << "dv, " << what;
}

// In float32, within float32 rounding of naive: the conformance suite's limits.
TEST(CudaFlashMath, TheKernelsTileAlgorithmMatchesNaive) {
  std::mt19937 rng(12);
  for (const Case& c : cases()) {
    const Data d = make_data(c, rng);
    const Results want = run_naive(c, d);
    for (const int64_t tile : {4, 16}) expect_close(run_tiled(c, d, tile, false), want, 2e-5, 1e-4, c.str());
  }
}

// With the tensor-core path's roundings, within the conformance suite's bf16 limits (8 u forward,
// 16 u for the gradients, u = 2^-9) of naive's float32 result; and the roundings do happen.
TEST(CudaFlashMath, TheBf16TileAlgorithmStaysWithinBf16RoundingOfNaive) {
  constexpr double u = 1.0 / 512.0;
  std::mt19937 rng(13);
  double moved = 0.0;
  for (const Case& c : cases()) {
    const Data d = make_data(c, rng);
    const Results want = run_naive(c, d);
    const Results got = run_tiled(c, d, 16, true);
    expect_close(got, want, 8 * u, 16 * u, c.str() + ", bf16");
    moved = std::max(moved, relative_error(got.out, want.out));
  }
  EXPECT_GT(moved, 1e-4) << "bf16 rounding changed nothing: the operands were not rounded";
}

}  // namespace
}  // namespace loom::test
