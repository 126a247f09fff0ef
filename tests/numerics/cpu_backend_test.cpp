// Properties of the cpu backend beyond the contract: GEMMs split into panels give the same bits
// as unsplit ones (so results do not depend on the thread count), and large problems match the
// reference.
#include <gtest/gtest.h>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

// In the default precision (bf16 products where the CPU has AVX512-BF16) and in float32.
class CpuBackendPrecision : public ::testing::TestWithParam<std::string> {
 protected:
  Handle<Backend> backend(ExecutionContext* execution) const {
    Value options = Value::map();
    if (!GetParam().empty()) options.set("matmul_precision", GetParam());
    return make_backend("cpu", execution, options);
  }
};

TEST_P(CpuBackendPrecision, SplitGemmsDoNotDependOnTheThreadCount) {
  auto one = make_execution_context(1), two = make_execution_context(2), three = make_execution_context(3);
  Handle<Backend> b1 = backend(one.get()), b2 = backend(two.get()), b3 = backend(three.get());
  struct Case {
    std::int64_t m, n, k;
  };
  // Above the split threshold (m*n*k >= 2^21), with odd sizes; the short-m cases stay unsplit; a
  // 256-row product (GPT-2 small at 4 x 64 tokens) splits near its middle, which only the finest
  // safe panel alignment allows.
  for (Case c : {Case{517, 131, 97}, Case{96, 777, 61}, Case{1031, 49, 129}, Case{64, 2049, 33}, Case{256, 300, 77}})
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k << " " << ta << tb);
        const Tensor a = random_tensor({c.m * c.k}, 1), b = random_tensor({c.k * c.n}, 2);
        const Tensor c0 = random_tensor({c.m * c.n}, 3);
        std::vector<std::vector<float>> results;
        for (Backend* be : {b1.get(), b2.get(), b3.get()}) {
          Tensor out = c0.clone();
          be->gemm(ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no, c.m, c.n, c.k, 1.0f,
                   a.data<float>(), ta ? c.m : c.k, b.data<float>(), tb ? c.k : c.n, 1.0f, out.data<float>(), c.n);
          results.push_back(out.to_vector());
        }
        EXPECT_TRUE(bitwise_equal(results[0], results[1]));
        EXPECT_TRUE(bitwise_equal(results[0], results[2]));
      }
}

INSTANTIATE_TEST_SUITE_P(Cpu, CpuBackendPrecision, ::testing::Values("", "f32"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param.empty() ? std::string("default") : info.param;
                         });

// The epilogue fused into the GEMM's row panels is the float32 path's (a bf16 product applies
// it after the product), compared with the oracle at float32 tolerances: matmul_precision f32.
TEST(CpuBackend, FusedLinearEpilogueMatchesTheReference) {
  // Large enough to be split into row panels, each applying bias + activation in cache.
  Handle<Backend> cpu = make_f32_backend("cpu"), ref = make_backend("reference");
  const Tensor x = random_tensor({3, 173, 64}, 8), w = random_tensor({301, 64}, 9, 0.2f), b = random_tensor({301}, 10);
  for (Activation act : {Activation::none, Activation::gelu_tanh, Activation::silu}) {
    Ops a(*cpu), r(*ref);
    EXPECT_TRUE(all_close(a.linear(x, w, b, {.activation = act}).to_vector(),
                          r.linear(x, w, b, {.activation = act}).to_vector(), 1e-5));
  }
  // The same bits on one thread and on three.
  auto one = make_execution_context(1), three = make_execution_context(3);
  Handle<Backend> c1 = make_f32_backend("cpu", one.get()), c3 = make_f32_backend("cpu", three.get());
  Ops o1(*c1), o3(*c3);
  EXPECT_TRUE(bitwise_equal(o1.linear(x, w, b, {.activation = Activation::gelu_tanh}).to_vector(),
                            o3.linear(x, w, b, {.activation = Activation::gelu_tanh}).to_vector()));
}

TEST(CpuBackend, LargeRowKernelsMatchTheReference) {
  // Sizes that make every kernel run in many chunks on the default grain.
  Handle<Backend> cpu = make_backend("cpu"), ref = make_backend("reference");
  const std::int64_t rows = 517, cols = 771, n = rows * cols;
  const Tensor x = random_tensor({n}, 4, 2.0f), dy = random_tensor({n}, 5), w = random_tensor({cols}, 6),
               b = random_tensor({cols}, 7);
  auto both = [&](auto&& f) {
    std::vector<std::vector<float>> r;
    for (Backend* be : {cpu.get(), ref.get()}) r.push_back(f(*be));
    return r;
  };
  auto ln = both([&](Backend& be) {
    Tensor y = Tensor::empty({n}), mean = Tensor::empty({rows}), rstd = Tensor::empty({rows}), dx = Tensor::empty({n}),
           dw = Tensor::empty({cols}), db = Tensor::empty({cols});
    be.layer_norm_forward(x.data<float>(), w.data<float>(), b.data<float>(), y.data<float>(), mean.data<float>(),
                          rstd.data<float>(), rows, cols, 1e-5f);
    be.layer_norm_backward(x.data<float>(), w.data<float>(), mean.data<float>(), rstd.data<float>(), dy.data<float>(),
                           dx.data<float>(), false, dw.data<float>(), false, db.data<float>(), false, rows, cols);
    std::vector<float> all = y.to_vector();
    for (const Tensor& t : {dx, dw, db}) {
      const auto v = t.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  });
  EXPECT_TRUE(all_close(ln[0], ln[1], 1e-4));
  auto bias = both([&](Backend& be) {
    Tensor pre = x.clone(), out = Tensor::empty({n}), dpre = Tensor::empty({n}), dbias = Tensor::empty({cols});
    be.bias_activation_forward(pre.data<float>(), b.data<float>(), out.data<float>(), rows, cols,
                               Activation::gelu_tanh);
    be.bias_activation_backward(pre.data<float>(), dy.data<float>(), dpre.data<float>(), dbias.data<float>(), false,
                                rows, cols, Activation::gelu_tanh);
    std::vector<float> all = out.to_vector();
    for (const Tensor& t : {dpre, dbias}) {
      const auto v = t.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  });
  EXPECT_TRUE(all_close(bias[0], bias[1], 1e-4));
}

}  // namespace
}  // namespace loom::test
