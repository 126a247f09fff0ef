// The backend contract at the kernel level, for every registered backend: BLAS semantics of
// gemm (transposes, leading dimensions, alpha, beta, beta == 0 ignoring NaN, k == 0), outputs
// written with accumulate == false never read, the aliasing the contract allows, empty sizes,
// and extreme inputs. Kernels receive addresses in the backend's own memory: the arguments are
// host vectors copied to the backend's buffer type for each call and read back after it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <loom/random.hpp>
#include <numeric>
#include <tuple>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

constexpr float nan_value = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_vector(std::size_t n, std::uint64_t key, float scale = 1.0f) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = scale * random_normal(key, static_cast<std::uint32_t>(i));
  return v;
}

bool any_nan(const std::vector<float>& v) {
  for (float x : v)
    if (std::isnan(x)) return true;
  return false;
}

// Kernel arguments in a backend's memory. Each host vector passed through operator() is copied
// to a buffer of the backend's buffer type (one buffer per vector, so passing a vector twice
// expresses aliasing); sync() copies the writable ones back and forgets them all. For a backend
// whose memory is the host's the vectors are passed as they are.
class DeviceArgs {
 public:
  explicit DeviceArgs(Backend& backend) : backend_(backend), host_(backend.buffer_type().host_visible()) {}
  ~DeviceArgs() { sync(); }
  DeviceArgs(const DeviceArgs&) = delete;
  DeviceArgs& operator=(const DeviceArgs&) = delete;

  float* operator()(std::vector<float>& v) { return host_ ? v.data() : bind(v, &v).device_data<float>(); }
  const float* operator()(const std::vector<float>& v) {
    return host_ ? v.data() : bind(v, nullptr).device_data<float>();
  }
  const std::int32_t* operator()(const std::vector<std::int32_t>& v) {
    if (host_) return v.data();
    const Tensor t = Tensor::from(std::span<const std::int32_t>(v), Shape{static_cast<std::int64_t>(v.size())});
    bound_.push_back({&v, nullptr, on_backend(t, backend_)});
    return bound_.back().device.device_data<std::int32_t>();
  }

  void sync() {
    for (Bound& b : bound_)
      if (b.writable) {
        const std::vector<float> values = b.device.to_vector();
        std::copy(values.begin(), values.end(), b.writable->begin());
      }
    bound_.clear();
  }

 private:
  struct Bound {
    const void* source;
    std::vector<float>* writable;  // copied back by sync(); null for inputs
    Tensor device;
  };
  const Tensor& bind(const std::vector<float>& v, std::vector<float>* writable) {
    for (Bound& b : bound_)
      if (b.source == &v) {
        if (writable) b.writable = writable;
        return b.device;
      }
    const Tensor t = Tensor::from(std::span<const float>(v), Shape{static_cast<std::int64_t>(v.size())});
    bound_.push_back({&v, writable, on_backend(t, backend_)});
    return bound_.back().device;
  }

  Backend& backend_;
  bool host_;
  std::vector<Bound> bound_;
};

class KernelContract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const auto why = device_unavailable(GetParam())) GTEST_SKIP() << *why;
    // The float32 kernels' contract: a backend with a mixed-precision option in float32.
    backend_ = make_f32_backend(GetParam());
    reference_ = make_backend("reference");
  }
  Handle<Backend> backend_, reference_;
};

// C = alpha op(A) op(B) + beta C in float64, for checking.
std::vector<float> gemm_expected(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                 const std::vector<float>& a, std::int64_t lda, const std::vector<float>& b,
                                 std::int64_t ldb, float beta, std::vector<float> c, std::int64_t ldc) {
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (std::int64_t p = 0; p < k; ++p)
        acc += static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) * (tb ? b[j * ldb + p] : b[p * ldb + j]);
      const double prior = beta == 0.0f ? 0.0 : beta * static_cast<double>(c[i * ldc + j]);
      c[i * ldc + j] = static_cast<float>(alpha * acc + prior);
    }
  return c;
}

TEST_P(KernelContract, GemmFollowsBlasSemantics) {
  struct Shape3 {
    std::int64_t m, n, k;
  };
  // Small ones, and ones above the cpu backend's threshold for splitting into panels.
  for (Shape3 s : {Shape3{7, 9, 11}, Shape3{1, 13, 5}, Shape3{301, 67, 129}, Shape3{33, 517, 131}})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 0.3f}) {
          SCOPED_TRACE(::testing::Message()
                       << s.m << "x" << s.n << "x" << s.k << " ta=" << ta << " tb=" << tb << " beta=" << beta);
          const std::int64_t lda = (ta ? s.m : s.k) + 3, ldb = (tb ? s.k : s.n) + 2, ldc = s.n + 5;
          const auto a = random_vector(static_cast<std::size_t>((ta ? s.k : s.m) * lda), 1);
          const auto b = random_vector(static_cast<std::size_t>((tb ? s.n : s.k) * ldb), 2);
          std::vector<float> c = random_vector(static_cast<std::size_t>(s.m * ldc), 3);
          if (beta == 0.0f) std::fill(c.begin(), c.end(), nan_value);  // beta == 0 must not read C
          const auto want = gemm_expected(ta, tb, s.m, s.n, s.k, 0.7f, a, lda, b, ldb, beta, c, ldc);
          DeviceArgs d(*backend_);
          backend_->gemm(ta ? Transpose::yes : Transpose::no, tb ? Transpose::yes : Transpose::no, s.m, s.n, s.k, 0.7f,
                         d(a), lda, d(b), ldb, beta, d(c), ldc);
          d.sync();
          // Compare the m x n window only; the padding of C must be left alone.
          std::vector<float> got_window, want_window;
          for (std::int64_t i = 0; i < s.m; ++i)
            for (std::int64_t j = 0; j < ldc; ++j) {
              const float g = c[static_cast<std::size_t>(i * ldc + j)], w = want[static_cast<std::size_t>(i * ldc + j)];
              if (j < s.n) {
                got_window.push_back(g);
                want_window.push_back(w);
              } else if (beta != 0.0f) {
                EXPECT_EQ(g, w) << "padding of C was written";
              }
            }
          EXPECT_FALSE(any_nan(got_window));
          EXPECT_TRUE(all_close(got_window, want_window, 1e-5));
        }
}

TEST_P(KernelContract, GemmWithEmptyInnerDimensionScalesC) {
  std::vector<float> c(12, 2.0f);
  DeviceArgs d(*backend_);
  backend_->gemm(Transpose::no, Transpose::no, 3, 4, 0, 1.0f, nullptr, 1, nullptr, 4, 0.5f, d(c), 4);
  d.sync();
  for (float v : c) EXPECT_EQ(v, 1.0f);
  std::fill(c.begin(), c.end(), nan_value);
  backend_->gemm(Transpose::no, Transpose::no, 3, 4, 0, 1.0f, nullptr, 1, nullptr, 4, 0.0f, d(c), 4);
  d.sync();
  for (float v : c) EXPECT_EQ(v, 0.0f);
  backend_->gemm(Transpose::no, Transpose::no, 0, 4, 3, 1.0f, nullptr, 3, nullptr, 4, 0.0f, nullptr, 4);
}

TEST_P(KernelContract, BatchedGemmSharesAZeroStrideOperand) {
  const std::int64_t batch = 5, m = 6, n = 7, k = 9;
  const auto a = random_vector(static_cast<std::size_t>(batch * m * k), 4);
  const auto b = random_vector(static_cast<std::size_t>(k * n), 5);
  std::vector<float> c(static_cast<std::size_t>(batch * m * n), nan_value);
  DeviceArgs d(*backend_);
  backend_->gemm_batched(Transpose::no, Transpose::no, m, n, k, 1.0f, d(a), k, m * k, d(b), n, 0, 0.0f, d(c), n, m * n,
                         batch);
  d.sync();
  for (std::int64_t i = 0; i < batch; ++i) {
    std::vector<float> ai(a.begin() + i * m * k, a.begin() + (i + 1) * m * k);
    const auto want = gemm_expected(false, false, m, n, k, 1.0f, ai, k, b, n, 0.0f, std::vector<float>(m * n), n);
    EXPECT_TRUE(all_close(std::vector<float>(c.begin() + i * m * n, c.begin() + (i + 1) * m * n), want, 1e-5));
  }
}

// Every kernel output written with accumulate == false (and every output that has no such flag)
// is prefilled with NaN: a kernel that reads it leaks NaN into the result.
TEST_P(KernelContract, OverwrittenOutputsAreNeverRead) {
  const std::int64_t rows = 5, cols = 37, n = rows * cols;
  const auto x = random_vector(n, 6), dy = random_vector(n, 7), up = random_vector(n, 8);
  const auto w = random_vector(cols, 9), bias = random_vector(cols, 10);
  std::vector<float> out(n), out2(n), vec(cols), vec2(cols), stats(rows), stats2(rows);
  auto poison = [](std::vector<float>& v) { std::fill(v.begin(), v.end(), nan_value); };
  Backend& be = *backend_;
  DeviceArgs d(be);

  for (Activation act : {Activation::gelu_tanh, Activation::silu}) {
    poison(out);
    be.activation_forward(act, d(x), d(out), n);
    d.sync();
    EXPECT_FALSE(any_nan(out));
    poison(out);
    be.activation_backward(act, d(x), d(dy), d(out), n, false);
    d.sync();
    EXPECT_FALSE(any_nan(out));
    poison(out);
    poison(vec);
    be.bias_activation_backward(d(x), d(dy), d(out), d(vec), false, rows, cols, act);
    d.sync();
    EXPECT_FALSE(any_nan(out) || any_nan(vec));
  }
  poison(out);
  poison(out2);
  be.swiglu_backward(d(x), d(up), d(dy), d(out), false, d(out2), false, n);
  d.sync();
  EXPECT_FALSE(any_nan(out) || any_nan(out2));
  poison(out);
  be.scale(d(x), 0.5f, d(out), n, false);
  d.sync();
  EXPECT_FALSE(any_nan(out));
  poison(out);
  be.dropout(d(x), d(out), n, 0.25f, 99, false);
  d.sync();
  EXPECT_FALSE(any_nan(out));

  std::vector<float> mean(rows), rstd(rows);
  be.layer_norm_forward(d(x), d(w), d(bias), d(out2), d(mean), d(rstd), rows, cols, 1e-5f);
  d.sync();
  poison(out);
  poison(vec);
  poison(vec2);
  be.layer_norm_backward(d(x), d(w), d(mean), d(rstd), d(dy), d(out), false, d(vec), false, d(vec2), false, rows, cols);
  d.sync();
  EXPECT_FALSE(any_nan(out) || any_nan(vec) || any_nan(vec2));
  be.rms_norm_forward(d(x), d(w), d(out2), d(rstd), rows, cols, 1e-6f);
  d.sync();
  poison(out);
  poison(vec);
  be.rms_norm_backward(d(x), d(w), d(rstd), d(dy), d(out), false, d(vec), false, rows, cols);
  d.sync();
  EXPECT_FALSE(any_nan(out) || any_nan(vec));

  // RoPE: [1, rows, 1, cols - 1] (an even head_dim), both directions.
  const std::int64_t hd = cols - 1;
  const RopeTable table(RopeConfig{}, hd, rows);
  const std::vector<float> cos = table.cos().to_vector(), sin = table.sin().to_vector();
  for (bool inverse : {false, true}) {
    poison(out);
    be.rope(d(x), rows * hd, hd, d(out), rows * hd, hd, d(cos), d(sin), nullptr, 0, 1, rows, 1, hd, false, inverse,
            false);
    d.sync();
    EXPECT_FALSE(any_nan(std::vector<float>(out.begin(), out.begin() + rows * hd)));
  }
}

TEST_P(KernelContract, AllowedAliasing) {
  const std::int64_t n = 301;
  const auto a = random_vector(n, 11), b = random_vector(n, 12);
  DeviceArgs d(*backend_);
  std::vector<float> y = a;
  backend_->add(d(y), d(b), d(y), n);  // y may be a
  d.sync();
  std::vector<float> want(n);
  reference_->add(a.data(), b.data(), want.data(), n);
  EXPECT_TRUE(all_close(y, want, 1e-7));
  y = a;
  backend_->scale(d(y), -2.0f, d(y), n, false);  // in-place scaling
  d.sync();
  for (std::int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], -2.0f * a[i]);
  // dpre may be dout: with no activation only the bias gradient is computed.
  y = a;
  std::vector<float> dbias(7), want_dbias(7);
  backend_->bias_activation_backward(nullptr, d(y), d(y), d(dbias), false, 43, 7, Activation::none);
  d.sync();
  reference_->bias_activation_backward(nullptr, a.data(), want.data(), want_dbias.data(), false, 43, 7,
                                       Activation::none);
  EXPECT_TRUE(all_close(dbias, want_dbias, 1e-5));
  EXPECT_EQ(y, a);
  backend_->bias_activation_backward(d(b), d(y), d(y), d(dbias), false, 43, 7, Activation::gelu_tanh);
  d.sync();
  reference_->bias_activation_backward(b.data(), a.data(), want.data(), want_dbias.data(), false, 43, 7,
                                       Activation::gelu_tanh);
  EXPECT_TRUE(all_close(y, want, 1e-5));
  EXPECT_TRUE(all_close(dbias, want_dbias, 1e-5));
}

TEST_P(KernelContract, EmptySizesDoNothing) {
  Backend& be = *backend_;
  float* none = nullptr;
  be.gemm_batched(Transpose::no, Transpose::no, 2, 2, 2, 1.0f, none, 2, 4, none, 2, 4, 0.0f, none, 2, 4, 0);
  be.bias_activation_forward(none, none, none, 0, 5, Activation::gelu_tanh);
  be.bias_activation_backward(none, none, none, none, false, 0, 5, Activation::none);
  be.activation_forward(Activation::silu, none, none, 0);
  be.activation_backward(Activation::silu, none, none, none, 0, false);
  be.swiglu_forward(none, none, none, 0);
  be.swiglu_backward(none, none, none, none, false, none, false, 0);
  be.add(none, none, none, 0);
  be.scale(none, 1.0f, none, 0, true);
  be.fill(none, 1.0f, 0);
  be.dropout(none, none, 0, 0.5f, 1, false);
  be.layer_norm_forward(none, none, none, none, none, none, 0, 4, 1e-5f);
  be.layer_norm_backward(none, none, none, none, none, none, false, none, false, none, false, 0, 4);
  be.rms_norm_forward(none, none, none, none, 0, 4, 1e-5f);
  be.rms_norm_backward(none, none, none, none, none, false, none, false, 0, 4);
  be.embedding_forward(none, nullptr, none, 0, 4, 3);
  be.embedding_backward(nullptr, none, none, 0, 4, 3);
  be.rope(none, 0, 0, none, 0, 0, none, none, nullptr, 0, 0, 3, 2, 4, false, false, false);
  be.cross_entropy_forward(none, 5, nullptr, none, none, 0, 5, -100);
  be.cross_entropy_backward(none, 5, nullptr, none, 1.0f, 0, 5, -100);
  SUCCEED();
}

TEST_P(KernelContract, CrossEntropyIsStableAndHonoursIgnoredRows) {
  const std::int64_t rows = 4, vocab = 1001;
  std::vector<float> logits = random_vector(rows * vocab, 13, 3.0f);
  logits[5] = 80.0f;            // would overflow exp() without the max shift
  logits[vocab + 9] = -1.0e4f;  // underflows
  logits[2 * vocab + 3] = 1.0e4f;
  const std::vector<std::int32_t> targets{5, 17, 3, -100};
  std::vector<float> losses(rows), lse(rows), want_losses(rows), want_lse(rows);
  DeviceArgs d(*backend_);
  backend_->cross_entropy_forward(d(logits), vocab, d(targets), d(losses), d(lse), rows, vocab, -100);
  d.sync();
  reference_->cross_entropy_forward(logits.data(), vocab, targets.data(), want_losses.data(), want_lse.data(), rows,
                                    vocab, -100);
  EXPECT_TRUE(all_close(losses, want_losses, 1e-5));
  EXPECT_TRUE(all_close(lse, want_lse, 1e-6));
  EXPECT_EQ(losses[3], 0.0f);
  std::vector<float> grad = logits, want = logits;
  backend_->cross_entropy_backward(d(grad), vocab, d(targets), d(lse), 0.25f, rows, vocab, -100);
  d.sync();
  reference_->cross_entropy_backward(want.data(), vocab, targets.data(), lse.data(), 0.25f, rows, vocab, -100);
  EXPECT_TRUE(all_close(grad, want, 1e-5));
  for (std::int64_t j = 0; j < vocab; ++j) EXPECT_EQ(grad[3 * vocab + j], 0.0f);
  // Each gradient row sums to zero (softmax minus one-hot).
  for (std::int64_t r = 0; r < 3; ++r) {
    double s = 0.0;
    for (std::int64_t j = 0; j < vocab; ++j) s += grad[r * vocab + j];
    EXPECT_NEAR(s, 0.0, 1e-5);
  }
}

TEST_P(KernelContract, DropoutMaskIsTheSharedCounterBasedOne) {
  const std::int64_t n = 20011;
  const float p = 0.3f;
  const std::vector<float> ones(n, 1.0f);
  std::vector<float> y(n);
  DeviceArgs d(*backend_);
  backend_->dropout(d(ones), d(y), n, p, 12345, false);
  d.sync();
  std::int64_t kept = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const bool keep = dropout_keep(12345, static_cast<std::uint32_t>(i), dropout_threshold(p));
    EXPECT_EQ(y[i], keep ? dropout_scale(p) : 0.0f) << i;
    kept += keep;
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.015);
}

// A mixture of experts' routing (BackendOp::routing) against a plain statement of the contract:
// each token's k largest logits, ties to the lower expert id, the expert-sorted tokens, each
// choice's row among the experts [first, last) (the zero row after them for the others) and the
// counts; on logits with many ties (values of a coarse grid, a row of equal values).
TEST_P(KernelContract, RouteTopKFollowsTheRoutingContract) {
  const std::int64_t tokens = 37, experts = 6;
  std::vector<float> logits(static_cast<std::size_t>(tokens * experts));
  for (std::size_t i = 0; i < logits.size(); ++i)
    logits[i] = std::round(2.0f * random_normal(91, static_cast<std::uint32_t>(i))) / 2.0f;
  std::fill_n(logits.begin() + 5 * experts, experts, 0.25f);  // token 5: all tied
  const Tensor x = on_backend(Tensor::from(std::span<const float>(logits), Shape{tokens, experts}), *backend_);
  for (const auto& [k, first, last] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{2, 0, experts},
                                       {1, 0, experts},
                                       {3, 2, 4},
                                       {experts, 0, experts},
                                       {2, 3, 3}}) {
    SCOPED_TRACE("k " + std::to_string(k) + ", experts [" + std::to_string(first) + ", " + std::to_string(last) + ")");
    // The contract, stated directly.
    std::vector<std::int32_t> chosen, slots(static_cast<std::size_t>(tokens * k)), sorted,
        counts(static_cast<std::size_t>(experts), 0);
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<std::int32_t> order(static_cast<std::size_t>(experts));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
        return logits[static_cast<std::size_t>(t * experts + a)] > logits[static_cast<std::size_t>(t * experts + b)];
      });
      for (std::int64_t j = 0; j < k; ++j) {
        chosen.push_back(static_cast<std::int32_t>(t * experts) + order[static_cast<std::size_t>(j)]);
        ++counts[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      }
    }
    std::int32_t row = 0, after = 0;
    for (std::int64_t e = first; e < last; ++e) after += counts[static_cast<std::size_t>(e)];
    for (std::int64_t e = 0; e < experts; ++e)
      for (std::int64_t t = 0; t < tokens; ++t)
        for (std::int64_t j = 0; j < k; ++j)
          if (chosen[static_cast<std::size_t>(t * k + j)] == t * experts + e) {
            sorted.push_back(static_cast<std::int32_t>(t));
            slots[static_cast<std::size_t>(t * k + j)] = e >= first && e < last ? row++ : after;
          }
    BufferType& type = backend_->buffer_type();
    const Tensor got_chosen = Tensor::empty(Shape{tokens, k}, DType::i32, type);
    const Tensor got_slots = Tensor::empty(Shape{tokens, k}, DType::i32, type);
    const Tensor got_sorted = Tensor::empty(Shape{tokens * k}, DType::i32, type);
    const Tensor got_counts = Tensor::empty(Shape{experts}, DType::i32, type);
    backend_->route_top_k(x.device_data<float>(), tokens, experts, k, first, last,
                          got_chosen.device_data<std::int32_t>(), got_slots.device_data<std::int32_t>(),
                          got_sorted.device_data<std::int32_t>(), got_counts.device_data<std::int32_t>());
    EXPECT_EQ(got_chosen.to_int_vector(), chosen);
    EXPECT_EQ(got_slots.to_int_vector(), slots);
    EXPECT_EQ(got_sorted.to_int_vector(), sorted);
    EXPECT_EQ(got_counts.to_int_vector(), counts);
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, KernelContract, ::testing::ValuesIn(registered("backend")),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace loom::test
