#include <gtest/gtest.h>

#include <cmath>
#include <loom/error.hpp>
#include <loom/transformer_blocks.hpp>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

TEST(RopeTable, DefaultFrequencies) {
  const RopeTable t(RopeConfig{.base = 10000.0}, 8, 4);
  const auto& f = t.inverse_frequencies();
  ASSERT_EQ(f.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(f[static_cast<std::size_t>(i)], std::pow(10000.0, -2.0 * i / 8));
  EXPECT_EQ(t.cos().shape(), (Shape{4, 4}));
  EXPECT_FLOAT_EQ(t.cos().data<float>()[3 * 4 + 1], static_cast<float>(std::cos(3 * f[1])));
  EXPECT_FLOAT_EQ(t.sin().data<float>()[2 * 4 + 2], static_cast<float>(std::sin(2 * f[2])));
}

TEST(RopeTable, Llama3ScalingMatchesTheReferenceImplementation) {
  // Llama 3.1 8B: head_dim 128, theta 500000, factor 8, low 1, high 4, original 8192. Expected
  // values from transformers' _compute_llama3_parameters, evaluated in float64.
  const RopeTable t(RopeConfig{.base = 500000.0,
                               .llama3_scaling = true,
                               .factor = 8.0,
                               .low_freq_factor = 1.0,
                               .high_freq_factor = 4.0,
                               .original_max_positions = 8192.0},
                    128, 2);
  const auto& f = t.inverse_frequencies();
  EXPECT_DOUBLE_EQ(f[0], 1.0);                       // short wavelength: kept
  EXPECT_NEAR(f[20], 0.016560440080994446, 1e-15);   // kept
  EXPECT_NEAR(f[30], 0.0013718935677611381, 1e-15);  // smoothly interpolated
  EXPECT_NEAR(f[40], 3.428102195952591e-05, 1e-17);  // divided by the factor
  EXPECT_NEAR(f[63], 3.068925988914511e-07, 1e-19);
}

TEST(RopeTable, LinearScalingDividesEveryFrequency) {
  // transformers' rope_type "linear": every inverse frequency divided by the factor, whatever the
  // base: Gemma 3's global layers' (1e6), and bases so small that some wavelengths 2 pi / theta_i
  // fall below 1 and below 1e-6, the Llama 3 rule's bounds gemma3 and llama wrote it with before
  // models::linear_rope (which left those frequencies unscaled).
  for (const double base : {1e6, 1e4, 0.01, 1e-12}) {
    const RopeTable t(models::linear_rope(base, 8.0), 8, 2);
    const auto& f = t.inverse_frequencies();
    ASSERT_EQ(f.size(), 4u);
    for (int i = 0; i < 4; ++i)
      EXPECT_EQ(f[static_cast<std::size_t>(i)], 1.0 / std::pow(base, 2.0 * i / 8.0) / 8.0)
          << "base " << base << ", i " << i;
  }
}

class RopeOp : public ::testing::Test {
 protected:
  Handle<Backend> backend_ = make_backend("cpu");
  Ops ops_{*backend_};
};

TEST_F(RopeOp, MatchesTheRotateHalfFormulation) {
  // HF: y = x * cos + rotate_half(x) * sin, with cos/sin repeated over both halves.
  const std::int64_t b = 2, t = 5, h = 3, d = 6;
  const RopeTable table(RopeConfig{}, d, 16);
  const Tensor x = random_tensor({b, t, h, d}, 1);
  const std::vector<float> y = ops_.rope(x, table, {}, 4).to_vector();
  const std::vector<float> xv = x.to_vector();
  const auto& f = table.inverse_frequencies();
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t ti = 0; ti < t; ++ti)
      for (std::int64_t hi = 0; hi < h; ++hi)
        for (std::int64_t j = 0; j < d; ++j) {
          const std::int64_t base = ((bi * t + ti) * h + hi) * d;
          const double angle = static_cast<double>(ti + 4) * f[static_cast<std::size_t>(j % (d / 2))];
          const double rotated = j < d / 2 ? -xv[static_cast<std::size_t>(base + j + d / 2)]
                                           : xv[static_cast<std::size_t>(base + j - d / 2)];
          EXPECT_NEAR(y[static_cast<std::size_t>(base + j)],
                      xv[static_cast<std::size_t>(base + j)] * std::cos(angle) + rotated * std::sin(angle), 1e-5);
        }
}

TEST_F(RopeOp, InterleavedIsAPermutationOfHalfSplit) {
  const std::int64_t d = 8;
  const RopeTable split(RopeConfig{}, d, 8), inter(RopeConfig{.interleaved = true}, d, 8);
  const Tensor x = random_tensor({1, 4, 2, d}, 2);
  // Move pair (i, i + d/2) to (2i, 2i + 1).
  Tensor xi = Tensor::empty(x.shape());
  for (std::int64_t i = 0; i < d / 2; ++i) {
    xi.select(3, 2 * i).copy_from(x.select(3, i));
    xi.select(3, 2 * i + 1).copy_from(x.select(3, i + d / 2));
  }
  const Tensor a = ops_.rope(x, split), c = ops_.rope(xi, inter);
  for (std::int64_t i = 0; i < d / 2; ++i) {
    EXPECT_TRUE(all_close(c.select(3, 2 * i).to_vector(), a.select(3, i).to_vector(), 1e-6));
    EXPECT_TRUE(all_close(c.select(3, 2 * i + 1).to_vector(), a.select(3, i + d / 2).to_vector(), 1e-6));
  }
}

TEST_F(RopeOp, PositionsAndErrors) {
  const RopeTable table(RopeConfig{}, 4, 8);
  const Tensor x = random_tensor({1, 3, 1, 4}, 3);
  // Position 0 is the identity; explicit positions equal the offset form.
  const Tensor zero = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{0, 0, 0}), Shape{1, 3});
  EXPECT_TRUE(all_close(ops_.rope(x, table, zero).to_vector(), x.to_vector(), 1e-7));
  const Tensor pos = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{2, 3, 4}), Shape{1, 3});
  EXPECT_TRUE(all_close(ops_.rope(x, table, pos).to_vector(), ops_.rope(x, table, {}, 2).to_vector(), 1e-7));
  const Tensor far = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{0, 1, 8}), Shape{1, 3});
  EXPECT_THROW(ops_.rope(x, table, far), InternalError);
  EXPECT_THROW(ops_.rope(x, table, {}, 6), InternalError);
  EXPECT_THROW(ops_.rope(random_tensor({1, 3, 1, 6}, 4), table), InternalError);
}

}  // namespace
}  // namespace loom::test
