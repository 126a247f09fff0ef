// The bf16 GEMM of the backend contract (Backend::gemm_bf16), for every registered backend whose
// memory the host can read: bf16 kernels where a backend declares them (supports_op(gemm, bf16)),
// Backend's default (rounded copies, float32 gemm) elsewhere. Both must compute the same
// product; the tolerances are those kinds/backend.hpp states:
//  * against the float64 product of the inputs rounded to bf16: 1e-5 relative to the result's
//    scale (all_close), as for the float32 gemm: the products of bf16 values are exact in
//    float32, only the float32 sums round;
//  * against the float64 product of the unrounded inputs: |error| <= 2^-8 sum_k |a_ik b_kj|
//    per element (each input is off by at most 2^-9 relative, so each product by about 2^-8).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <fstream>
#include <limits>
#include <loom/execution.hpp>
#include <loom/random.hpp>
#include <string>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

std::vector<float> random_vector(std::size_t n, std::uint64_t key) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = random_normal(key, static_cast<std::uint32_t>(i));
  return v;
}

float bf16_round(float x) {
  return to_float(to_bfloat16(x));
}

struct Gemm {
  std::int64_t m, n, k;
  bool ta, tb;
  float alpha, beta;
  std::int64_t lda() const { return (ta ? m : k) + 3; }
  std::int64_t ldb() const { return (tb ? k : n) + 2; }
  std::int64_t ldc() const { return n + 5; }
  float a(const std::vector<float>& v, std::int64_t i, std::int64_t p) const {
    return ta ? v[static_cast<std::size_t>(p * lda() + i)] : v[static_cast<std::size_t>(i * lda() + p)];
  }
  float b(const std::vector<float>& v, std::int64_t p, std::int64_t j) const {
    return tb ? v[static_cast<std::size_t>(j * ldb() + p)] : v[static_cast<std::size_t>(p * ldb() + j)];
  }
};

std::vector<std::string> host_backends() {
  std::vector<std::string> names;
  for (const auto& n : registered("backend"))
    if (!device_unavailable(n) && make_backend(n)->buffer_type().host_visible()) names.push_back(n);
  return names;
}

class BackendBf16 : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendBf16, GemmBf16IsTheProductOfTheRoundedInputs) {
  Handle<Backend> backend = make_backend(GetParam());
  // Small ones; odd k; ones past the cpu kernel's blocks (192 rows, 256 columns, 1024 k) and its
  // threshold for splitting into panels, cut by columns (m < n) and by rows (m >= n).
  for (Gemm g : {Gemm{7, 9, 11, false, false, 0.7f, 0.0f}, Gemm{1, 13, 5, false, false, 1.0f, 0.3f},
                 Gemm{301, 67, 129, false, false, 0.7f, 0.0f}, Gemm{33, 517, 131, false, false, 1.0f, 0.3f},
                 Gemm{130, 530, 1031, false, false, 1.0f, 0.0f}, Gemm{530, 130, 1031, false, false, 1.0f, 0.3f}}) {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        g.ta = ta;
        g.tb = tb;
        SCOPED_TRACE(::testing::Message()
                     << g.m << "x" << g.n << "x" << g.k << " ta=" << ta << " tb=" << tb << " beta=" << g.beta);
        const auto a = random_vector(static_cast<std::size_t>((ta ? g.k : g.m) * g.lda()), 1);
        const auto b = random_vector(static_cast<std::size_t>((tb ? g.n : g.k) * g.ldb()), 2);
        std::vector<float> c = random_vector(static_cast<std::size_t>(g.m * g.ldc()), 3);
        if (g.beta == 0.0f) std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
        const std::vector<float> prior = c;
        backend->gemm_bf16(ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no, g.m, g.n, g.k,
                           g.alpha, a.data(), g.lda(), b.data(), g.ldb(), g.beta, c.data(), g.ldc());
        std::vector<float> got, rounded, exact;
        bool within_bf16_bound = true;
        double worst_excess = 0.0;
        for (std::int64_t i = 0; i < g.m; ++i)
          for (std::int64_t j = 0; j < g.ldc(); ++j) {
            const std::size_t at = static_cast<std::size_t>(i * g.ldc() + j);
            if (j >= g.n) {
              if (g.beta != 0.0f) {
                EXPECT_EQ(c[at], prior[at]) << "padding of C was written";
              }
              continue;
            }
            double r = 0.0, e = 0.0, magnitude = 0.0;
            for (std::int64_t p = 0; p < g.k; ++p) {
              const double x = g.a(a, i, p), y = g.b(b, p, j);
              r += static_cast<double>(bf16_round(static_cast<float>(x))) * bf16_round(static_cast<float>(y));
              e += x * y;
              magnitude += std::abs(x * y);
            }
            const double before = g.beta == 0.0f ? 0.0 : g.beta * static_cast<double>(prior[at]);
            got.push_back(c[at]);
            rounded.push_back(static_cast<float>(g.alpha * r + before));
            exact.push_back(static_cast<float>(g.alpha * e + before));
            const double excess = std::abs(c[at] - (g.alpha * e + before)) - std::ldexp(g.alpha * magnitude, -8);
            if (excess > 0) {
              within_bf16_bound = false;
              worst_excess = std::max(worst_excess, excess);
            }
          }
        EXPECT_TRUE(all_close(got, rounded, 1e-5));
        EXPECT_TRUE(within_bf16_bound) << "off the unrounded product by up to " << worst_excess
                                       << " beyond 2^-8 sum |a b|";
        // The inputs really are rounded: the result is not the float32 product.
        if (g.k > 100) {
          EXPECT_FALSE(all_close(got, exact, 1e-5));
        }
      }
  }
}

TEST_P(BackendBf16, GemmBf16WithEmptyInnerDimensionScalesC) {
  Handle<Backend> backend = make_backend(GetParam());
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  backend->gemm_bf16(Transpose::no, Transpose::no, 2, 3, 0, 1.0f, nullptr, 1, nullptr, 3, 0.5f, c.data(), 3);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  backend->gemm_bf16(Transpose::no, Transpose::no, 0, 3, 3, 1.0f, nullptr, 3, nullptr, 3, 0.0f, nullptr, 3);
}

TEST_P(BackendBf16, GemmBf16DoesNotDependOnTheThreadCount) {
  // Cut by rows (m >= n) and by columns, one block of k and several, every layout of A and B.
  for (const auto& [m, n, k] : {std::array<std::int64_t, 3>{384, 256, 300}, std::array<std::int64_t, 3>{250, 700, 1100},
                                std::array<std::int64_t, 3>{700, 130, 1100}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
                     " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
        const auto a = random_vector(static_cast<std::size_t>(m * k), 4),
                   b = random_vector(static_cast<std::size_t>(k * n), 5);
        std::vector<std::vector<float>> results;
        for (int threads : {1, 2}) {
          auto pool = make_execution_context(threads);
          Handle<Backend> backend = make_backend(GetParam(), pool.get());
          std::vector<float> c(static_cast<std::size_t>(m * n));
          backend->gemm_bf16(ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no, m, n, k, 1.0f,
                             a.data(), ta ? m : k, b.data(), tb ? k : n, 0.0f, c.data(), n);
          results.push_back(c);
        }
        EXPECT_TRUE(bitwise_equal(results[0], results[1]));
      }
}

// cpu declares bf16 GEMMs exactly where the CPU has AVX512-BF16 (and nothing else in bf16).
TEST(CpuBackendBf16, DeclaresBf16GemmWhereTheCpuHasAvx512Bf16) {
  const auto names = registered("backend");
  if (std::find(names.begin(), names.end(), "cpu") == names.end()) GTEST_SKIP() << "no cpu backend in this build";
  std::ifstream cpuinfo("/proc/cpuinfo");
  if (!cpuinfo) GTEST_SKIP() << "no /proc/cpuinfo to read the CPU's features from";
  bool flag = false;
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("flags", 0) == 0) {
      flag = line.find(" avx512_bf16") != std::string::npos;
      break;
    }
  Handle<Backend> cpu = make_backend("cpu");
  EXPECT_EQ(cpu->supports_op(BackendOp::gemm, DType::bf16), flag);
  EXPECT_FALSE(cpu->supports_op(BackendOp::layer_norm, DType::bf16));
  EXPECT_TRUE(cpu->supports_op(BackendOp::layer_norm, DType::f32));
}

// cpu's matmul_precision: bf16 routes every float32 GEMM (gemm, gemm_batched, linear_forward)
// through the bf16 product where the CPU has AVX512-BF16, and leaves them float32 elsewhere.
TEST(CpuBackendBf16, MatmulPrecisionBf16MakesEveryGemmABf16Product) {
  const auto names = registered("backend");
  if (std::find(names.begin(), names.end(), "cpu") == names.end()) GTEST_SKIP() << "no cpu backend in this build";
  Value options = Value::map();
  options.set("matmul_precision", Value("bf16"));
  Handle<Backend> mixed = make_backend("cpu", nullptr, options);
  Handle<Backend> plain = make_f32_backend("cpu");
  const bool bf16 = plain->supports_op(BackendOp::gemm, DType::bf16);
  const std::int64_t m = 150, n = 70, k = 300, batch = 3;
  const auto a = random_vector(static_cast<std::size_t>(batch * m * k), 6);
  const auto b = random_vector(static_cast<std::size_t>(batch * k * n), 7);
  std::vector<float> want(static_cast<std::size_t>(batch * m * n)), got = want, got_batched = want;
  for (std::int64_t i = 0; i < batch; ++i) {
    const std::size_t ai = static_cast<std::size_t>(i * m * k), bi = static_cast<std::size_t>(i * k * n),
                      ci = static_cast<std::size_t>(i * m * n);
    if (bf16)
      plain->gemm_bf16(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data() + ai, k, b.data() + bi, k, 0.0f,
                       want.data() + ci, n);
    else
      plain->gemm(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data() + ai, k, b.data() + bi, k, 0.0f,
                  want.data() + ci, n);
    mixed->gemm(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data() + ai, k, b.data() + bi, k, 0.0f, got.data() + ci,
                n);
  }
  EXPECT_TRUE(bitwise_equal(got, want));
  mixed->gemm_batched(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data(), k, m * k, b.data(), k, k * n, 0.0f,
                      got_batched.data(), n, m * n, batch);
  EXPECT_TRUE(bitwise_equal(got_batched, want));
  std::vector<float> pre(static_cast<std::size_t>(m * n));
  mixed->linear_forward(Transpose::no, Transpose::yes, m, n, k, a.data(), k, b.data(), k, pre.data(), nullptr, nullptr,
                        Activation::none);
  EXPECT_TRUE(bitwise_equal(pre, std::vector<float>(want.begin(), want.begin() + m * n)));
  if (bf16) {
    std::vector<float> f32(static_cast<std::size_t>(m * n));
    plain->gemm(Transpose::no, Transpose::yes, m, n, k, 1.0f, a.data(), k, b.data(), k, 0.0f, f32.data(), n);
    EXPECT_FALSE(all_close(f32, pre, 1e-5)) << "the products were not rounded to bf16";
  }
}

// matmul_precision: auto, the default, is bf16 where the CPU has AVX512-BF16 and float32
// elsewhere; f32 and bf16 ask for one (bf16 falls back to float32 without AVX512-BF16).
// matmul_dtype() says what the backend computes in, and its products are those of that dtype.
TEST(CpuBackendBf16, MatmulPrecisionAutoIsBf16WhereTheCpuHasAvx512Bf16) {
  const auto names = registered("backend");
  if (std::find(names.begin(), names.end(), "cpu") == names.end()) GTEST_SKIP() << "no cpu backend in this build";
  const bool has_bf16 = cpu_has_avx512_bf16();
  const DType native = has_bf16 ? DType::bf16 : DType::f32;
  auto with = [](const std::string& precision) {
    Value options = Value::map();
    if (!precision.empty()) options.set("matmul_precision", Value(precision));
    return make_backend("cpu", nullptr, options);
  };
  Handle<Backend> by_default = with(""), automatic = with("auto"), f32 = with("f32"), bf16 = with("bf16");
  EXPECT_EQ(by_default->matmul_dtype(), native);
  EXPECT_EQ(automatic->matmul_dtype(), native);
  EXPECT_EQ(f32->matmul_dtype(), DType::f32);
  EXPECT_EQ(bf16->matmul_dtype(), native);
  EXPECT_EQ(by_default->supports_op(BackendOp::gemm, DType::bf16), has_bf16);

  // The products follow: the default's gemm is the bf16 product on such a CPU, float32 elsewhere.
  const std::int64_t m = 97, n = 130, k = 300;
  const auto a = random_vector(static_cast<std::size_t>(m * k), 8);
  const auto b = random_vector(static_cast<std::size_t>(k * n), 9);
  auto product = [&](Backend& be, bool rounded) {
    std::vector<float> c(static_cast<std::size_t>(m * n));
    if (rounded)
      be.gemm_bf16(Transpose::no, Transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    else
      be.gemm(Transpose::no, Transpose::no, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    return c;
  };
  const std::vector<float> float32 = product(*f32, false), mixed = product(*f32, true);
  const std::vector<float>& want = has_bf16 ? mixed : float32;
  EXPECT_TRUE(bitwise_equal(product(*by_default, false), want));
  EXPECT_TRUE(bitwise_equal(product(*automatic, false), want));
  if (has_bf16) {
    EXPECT_FALSE(all_close(float32, mixed, 1e-5)) << "the bf16 products were not rounded";
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendBf16, ::testing::ValuesIn(host_backends()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace loom::test
