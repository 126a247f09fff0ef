// The CUDA backend's per-element arithmetic on the host (plugins/backend/cuda/kernel_math.hpp):
// the LOOM_HOST_DEVICE functions its GPU kernels call, compiled here by the C++ compiler and
// checked against the `reference` backend's kernels bit for bit (the formulas are reference's, in
// float64), the router's selection against std::partial_sort (NaN logits and ties included), and
// fill_normal's test of which values the GPU cannot be trusted to round as the host does.
#include "kernel_math.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <loom/random.hpp>
#include <numeric>
#include <vector>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

namespace math = loom::cuda::math;

std::vector<float> values(std::size_t n, std::uint64_t key, float scale) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * random_normal(key, static_cast<std::uint32_t>(i));
  return v;
}

::testing::AssertionResult same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (std::size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << got[i] << " vs reference " << want[i];
  return ::testing::AssertionSuccess();
}

constexpr std::size_t kN = 4099;

TEST(CudaKernelMath, ActivationsAreReferencesBitForBit) {
  Handle<Backend> reference = make_backend("reference");
  const auto x = values(kN, 1, 3.0f), dy = values(kN, 2, 1.0f), prior = values(kN, 3, 1.0f);
  for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
    SCOPED_TRACE(static_cast<int>(act));
    std::vector<float> want(kN), got(kN);
    reference->activation_forward(act, x.data(), want.data(), kN);
    for (std::size_t i = 0; i < kN; ++i) got[i] = static_cast<float>(math::act_value(static_cast<int>(act), x[i]));
    EXPECT_TRUE(same_bits(got, want));
    for (bool accumulate : {false, true}) {
      std::vector<float> w = prior, g = prior;
      reference->activation_backward(act, x.data(), dy.data(), w.data(), kN, accumulate);
      for (std::size_t i = 0; i < kN; ++i)
        math::store(g.data(), static_cast<std::int64_t>(i),
                    static_cast<double>(dy[i]) * math::act_derivative(static_cast<int>(act), x[i]), accumulate);
      EXPECT_TRUE(same_bits(g, w)) << "backward, accumulate " << accumulate;
    }
  }
}

TEST(CudaKernelMath, SwiGluIsReferencesBitForBit) {
  Handle<Backend> reference = make_backend("reference");
  const auto gate = values(kN, 4, 3.0f), up = values(kN, 5, 2.0f), dy = values(kN, 6, 1.0f);
  std::vector<float> want(kN), got(kN);
  reference->swiglu_forward(gate.data(), up.data(), want.data(), kN);
  for (std::size_t i = 0; i < kN; ++i) got[i] = static_cast<float>(math::swiglu_value(gate[i], up[i]));
  EXPECT_TRUE(same_bits(got, want));
  std::vector<float> wg(kN), wu(kN), gg(kN), gu(kN);
  reference->swiglu_backward(gate.data(), up.data(), dy.data(), wg.data(), false, wu.data(), false, kN);
  for (std::size_t i = 0; i < kN; ++i) {
    math::store(gg.data(), static_cast<std::int64_t>(i), math::swiglu_dgate(gate[i], up[i], dy[i]), false);
    math::store(gu.data(), static_cast<std::int64_t>(i), math::swiglu_dup(gate[i], dy[i]), false);
  }
  EXPECT_TRUE(same_bits(gg, wg));
  EXPECT_TRUE(same_bits(gu, wu));
}

TEST(CudaKernelMath, SoftcapAndDropoutAreReferencesBitForBit) {
  Handle<Backend> reference = make_backend("reference");
  const auto x = values(kN, 7, 40.0f), dy = values(kN, 8, 1.0f);
  const float cap = 30.0f;
  std::vector<float> wy(kN), wh(kN), gy(kN), gh(kN);
  reference->softcap_forward(x.data(), wy.data(), wh.data(), kN, cap);
  for (std::size_t i = 0; i < kN; ++i) {
    const double h = math::softcap_tanh(x[i], cap);
    gy[i] = static_cast<float>(cap * h);
    gh[i] = static_cast<float>(h);
  }
  EXPECT_TRUE(same_bits(gy, wy));
  EXPECT_TRUE(same_bits(gh, wh));
  std::vector<float> wdx(kN), gdx(kN);
  reference->softcap_backward(wh.data(), 1.0f, dy.data(), wdx.data(), kN, false);
  for (std::size_t i = 0; i < kN; ++i)
    math::store(gdx.data(), static_cast<std::int64_t>(i), math::softcap_grad(wh[i], 1.0f, dy[i]), false);
  EXPECT_TRUE(same_bits(gdx, wdx));

  const float p = 0.3f;
  const std::uint64_t key = stream_key(1, 3, 7);
  std::vector<float> wd(kN), gd(kN);
  reference->dropout(x.data(), wd.data(), kN, p, key, false);
  for (std::size_t i = 0; i < kN; ++i) {
    const bool keep = dropout_keep(key, static_cast<std::uint32_t>(i), dropout_threshold(p));
    math::store(gd.data(), static_cast<std::int64_t>(i), math::dropout_value(x[i], keep, dropout_scale(p)), false);
  }
  EXPECT_TRUE(same_bits(gd, wd));
}

TEST(CudaKernelMath, RopeIsReferencesBitForBit) {
  Handle<Backend> reference = make_backend("reference");
  const std::int64_t seq = 7, heads = 3, head_dim = 8, half = head_dim / 2;
  const auto x = values(static_cast<std::size_t>(seq * heads * head_dim), 9, 1.0f);
  std::vector<float> cos(static_cast<std::size_t>(seq * half)), sin(cos.size());
  for (std::int64_t pos = 0; pos < seq; ++pos)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(i) / head_dim);
      cos[static_cast<std::size_t>(pos * half + i)] = static_cast<float>(std::cos(angle));
      sin[static_cast<std::size_t>(pos * half + i)] = static_cast<float>(std::sin(angle));
    }
  for (bool interleaved : {false, true})
    for (bool inverse : {false, true}) {
      std::vector<float> want(x.size()), got(x.size());
      reference->rope(x.data(), seq * heads * head_dim, heads * head_dim, want.data(), seq * heads * head_dim,
                      heads * head_dim, cos.data(), sin.data(), nullptr, 0, 1, seq, heads, head_dim, interleaved,
                      inverse, false);
      for (std::int64_t t = 0; t < seq; ++t)
        for (std::int64_t h = 0; h < heads; ++h)
          for (std::int64_t i = 0; i < half; ++i) {
            const std::int64_t base = t * heads * head_dim + h * head_dim;
            const std::int64_t ia = base + (interleaved ? 2 * i : i), ib = base + (interleaved ? 2 * i + 1 : i + half);
            const double c = cos[static_cast<std::size_t>(t * half + i)];
            const double s = inverse ? -static_cast<double>(sin[static_cast<std::size_t>(t * half + i)])
                                     : sin[static_cast<std::size_t>(t * half + i)];
            double ya, yb;
            math::rope_pair(x[static_cast<std::size_t>(ia)], x[static_cast<std::size_t>(ib)], c, s, ya, yb);
            math::store(got.data(), ia, ya, false);
            math::store(got.data(), ib, yb, false);
          }
      EXPECT_TRUE(same_bits(got, want)) << "interleaved " << interleaved << ", inverse " << inverse;
    }
}

// The GPU's router selects with this port of libstdc++'s partial_sort: the same choices as the
// host's std::partial_sort, for every k, with ties and NaN logits (not a strict weak order, so
// the result depends on the algorithm's exact steps).
TEST(CudaKernelMath, TheRoutersSelectionIsStdPartialSortStepForStep) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::uint32_t draw = 0;
  for (std::int32_t experts : {1, 2, 3, 5, 8, 16, 17, 64})
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<float> row(static_cast<std::size_t>(experts));
      for (std::int32_t e = 0; e < experts; ++e) {
        const std::uint32_t bits = random_bits(11, draw++);
        // Few distinct values (ties), some NaN, some infinities.
        row[static_cast<std::size_t>(e)] = bits % 13 == 0   ? nan
                                           : bits % 17 == 0 ? -std::numeric_limits<float>::infinity()
                                                            : static_cast<float>(static_cast<int>(bits % 7) - 3);
      }
      for (std::int32_t k = 1; k <= experts; ++k) {
        std::vector<std::int64_t> want(static_cast<std::size_t>(experts));
        std::iota(want.begin(), want.end(), 0);
        const float* r = row.data();
        std::partial_sort(want.begin(), want.begin() + k, want.end(),
                          [&](std::int64_t a, std::int64_t b) { return r[a] > r[b] || (r[a] == r[b] && a < b); });
        std::vector<std::int32_t> got(static_cast<std::size_t>(experts));
        std::iota(got.begin(), got.end(), 0);
        math::partial_sort(got.data(), k, experts, math::TopKOrder{r});
        for (std::int32_t j = 0; j < k; ++j)
          ASSERT_EQ(got[static_cast<std::size_t>(j)], want[static_cast<std::size_t>(j)])
              << experts << " experts, k " << k << ", trial " << trial << ", choice " << j;
      }
    }
}

// fill_normal: a value near_float_boundary does not flag rounds to the same float within +-16
// ulps of double of it, far more than the GPU's log and cos can differ from glibc's; the flagged
// ones (recomputed on the host) are about one in 2^22.
TEST(CudaKernelMath, FillNormalsUncertainValuesAreRareAndTheOthersRoundAlike) {
  const std::uint64_t key = stream_key(1234, 1, 0);
  const std::uint32_t n = 1u << 20;
  std::uint32_t flagged = 0;
  for (std::uint32_t i = 0; i < n; ++i) {
    const double wide = random_normal_wide(key, i);
    ASSERT_EQ(static_cast<float>(wide), random_normal(key, i));
    if (math::near_float_boundary(wide)) {
      ++flagged;
      continue;
    }
    double up = wide, down = wide;
    for (int s = 0; s < 16; ++s) {
      up = std::nextafter(up, INFINITY);
      down = std::nextafter(down, -INFINITY);
    }
    ASSERT_EQ(static_cast<float>(up), static_cast<float>(wide)) << i;
    ASSERT_EQ(static_cast<float>(down), static_cast<float>(wide)) << i;
  }
  EXPECT_LE(flagged, 16u) << "of " << n;
  // A value one ulp of double from the midpoint between two floats is flagged; a float is not.
  const double mid = 0.5 * (1.0 + static_cast<double>(std::nextafter(1.0f, 2.0f)));
  EXPECT_TRUE(math::near_float_boundary(std::nextafter(mid, 0.0)));
  EXPECT_TRUE(math::near_float_boundary(0.0));
  EXPECT_FALSE(math::near_float_boundary(1.0));
  EXPECT_FALSE(math::near_float_boundary(static_cast<double>(std::nextafter(1.0f, 2.0f))));
}

}  // namespace
}  // namespace loom::test
