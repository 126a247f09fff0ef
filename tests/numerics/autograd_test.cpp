// The tape's mechanics: gradient routing and accumulation, no-grad mode, views, aliasing,
// multiple outputs and roots, memory release, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <loom/allocator.hpp>
#include <loom/error.hpp>
#include <numeric>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

Tensor values(std::vector<float> v, const Shape& s) {
  return Tensor::from(std::span<const float>(v), s);
}

class Autograd : public ::testing::Test {
 protected:
  Handle<Backend> ref_ = make_backend("reference");
  Handle<Backend> cpu_ = make_backend("cpu");
};

TEST_F(Autograd, LinearGradientsByHand) {
  Parameter x("x", values({1, 2}, {1, 2}));
  Parameter w("w", values({1, 0, 3, 2}, {2, 2}));  // [out, in]
  Parameter b("b", values({0.5f, -1}, {2}));
  Tape tape;
  Ops ops(*ref_, &tape);
  Tensor y = ops.linear(x.tensor(), w.tensor(), b.tensor());
  EXPECT_EQ(y.to_vector(), (std::vector<float>{1.5f, 6.0f}));
  EXPECT_EQ(tape.size(), 1u);
  tape.backward(y, values({1, 10}, {1, 2}));
  EXPECT_EQ(tape.size(), 0u);
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{1, 2, 10, 20}));  // seed^T x
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{31, 20}));        // seed W
  EXPECT_EQ(b.grad().to_vector(), (std::vector<float>{1, 10}));
}

TEST_F(Autograd, GradientsAccumulateUntilZeroGrad) {
  Parameter w("w", values({2, 3}, {2}));
  Tape tape;
  Ops ops(*cpu_, &tape);
  for (int i = 0; i < 2; ++i) tape.backward(ops.scale(w.tensor(), 3.0f), values({1, 1}, {2}));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{6, 6}));
  w.zero_grad();
  EXPECT_FALSE(w.has_grad());
  EXPECT_FALSE(w.grad().defined());
  tape.backward(ops.scale(w.tensor(), -1.0f), values({1, 2}, {2}));
  EXPECT_EQ(w.grad().to_vector(), (std::vector<float>{-1, -2}));
}

TEST_F(Autograd, NoGradModeRecordsNothing) {
  Parameter w("w", values({1, 2, 3}, {3}));
  Tape tape;
  Ops ops(*cpu_, &tape);
  {
    NoGradGuard guard(tape);
    EXPECT_FALSE(tape.recording());
    Tensor y = ops.gelu(ops.scale(w.tensor(), 2.0f));
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(tape.size(), 0u);
    EXPECT_THROW(tape.backward(ops.scale(y, 1.0f), Tensor::full({3}, 1.0f)), InternalError);
  }
  EXPECT_TRUE(tape.recording());
  Ops untaped(*cpu_);
  EXPECT_FALSE(untaped.scale(w.tensor(), 2.0f).requires_grad());
  // Frozen parameters are constants too.
  w.set_requires_grad(false);
  EXPECT_FALSE(ops.scale(w.tensor(), 2.0f).requires_grad());
  EXPECT_EQ(tape.size(), 0u);
}

TEST_F(Autograd, TensorsOfAClearedTapeAreRejected) {
  Parameter w("w", values({1, 2}, {2}));
  Tape tape;
  Ops ops(*cpu_, &tape);
  Tensor y = ops.scale(w.tensor(), 2.0f);
  tape.clear();
  try {
    ops.add(y, w.tensor());
    FAIL() << "expected an error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("add"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("cleared"), std::string::npos);
  }
  // Detached, it is a constant.
  EXPECT_NO_THROW(ops.add(y.detach(), w.tensor()));
}

TEST_F(Autograd, ViewsRouteGradientsToTheirPartOfTheBase) {
  Parameter p("p", Tensor::full({2, 6}, 1.0f));
  Tape tape;
  Ops ops(*ref_, &tape);
  Tensor a = p.tensor().slice(1, 0, 3), b = p.tensor().slice(1, 3, 6);
  Tensor y = ops.add(ops.scale(a, 2.0f), b);
  tape.backward(y, Tensor::full({2, 3}, 1.0f));
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{2, 2, 2, 1, 1, 1, 2, 2, 2, 1, 1, 1}));
  // An intermediate's views: a fused projection split three ways.
  p.zero_grad();
  Tensor fused = ops.scale(p.tensor(), 1.0f).view({2, 3, 2});
  Tensor y2 = ops.add(ops.scale(fused.select(1, 0), 5.0f), fused.select(1, 2));
  tape.backward(y2, Tensor::full({2, 2}, 1.0f));
  EXPECT_EQ(p.grad().to_vector(), (std::vector<float>{5, 5, 0, 0, 1, 1, 5, 5, 0, 0, 1, 1}));
}

TEST_F(Autograd, AnInputUsedTwiceGetsBothContributions) {
  Parameter x("x", values({1, -2, 3}, {3}));
  Tape tape;
  Ops ops(*cpu_, &tape);
  tape.backward(ops.add(x.tensor(), x.tensor()), Tensor::full({3}, 1.0f));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{2, 2, 2}));
  // swiglu(x, x) = silu(x) * x: both gradients land in one buffer.
  x.zero_grad();
  Ops ref_ops(*ref_, &tape);
  tape.backward(ref_ops.swiglu(x.tensor(), x.tensor()), Tensor::full({3}, 1.0f));
  const std::vector<float> g = x.grad().to_vector();
  for (int i = 0; i < 3; ++i) {
    const double v = std::vector<double>{1, -2, 3}[static_cast<std::size_t>(i)];
    const double s = 1.0 / (1.0 + std::exp(-v));
    EXPECT_NEAR(g[static_cast<std::size_t>(i)], s * (1 + v * (1 - s)) * v + v * s, 1e-5);
  }
}

TEST_F(Autograd, FusedAddNormMatchesItsComposition) {
  const Tensor r = random_tensor({3, 5, 24}, 1), x = random_tensor({3, 5, 24}, 2), w = random_tensor({24}, 3),
               b = random_tensor({24}, 4);
  const Tensor seed_sum = random_tensor({3, 5, 24}, 5), seed_y = random_tensor({3, 5, 24}, 6);
  auto run = [&](bool fused) {
    Parameter pr("r", r.clone()), px("x", x.clone()), pw("w", w.clone()), pb("b", b.clone());
    Tape tape;
    Ops ops(*cpu_, &tape);
    Tensor sum, y;
    if (fused) {
      std::tie(sum, y) = ops.add_layer_norm(pr.tensor(), px.tensor(), pw.tensor(), pb.tensor());
    } else {
      sum = ops.add(pr.tensor(), px.tensor());
      y = ops.layer_norm(sum, pw.tensor(), pb.tensor());
    }
    std::vector<std::vector<float>> out{sum.to_vector(), y.to_vector()};
    const std::vector<Tensor> roots{sum, y}, seeds{seed_sum, seed_y};
    tape.backward(roots, seeds);
    for (Parameter* p : {&pr, &px, &pw, &pb}) out.push_back(p->grad().to_vector());
    return out;
  };
  const auto a = run(true), b2 = run(false);
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(all_close(a[i], b2[i], 1e-5)) << i;
}

TEST_F(Autograd, GradientsCanLiveInAFlatBuffer) {
  Tensor flat = Tensor::zeros({10});
  Parameter a("a", Tensor::full({2, 2}, 1.0f)), b("b", Tensor::full({6}, 1.0f));
  a.set_grad_buffer(flat.slice(0, 0, 4).view({2, 2}));
  b.set_grad_buffer(flat.slice(0, 4, 10));
  Tape tape;
  Ops ops(*cpu_, &tape);
  tape.backward(ops.scale(a.tensor(), 3.0f), Tensor::full({2, 2}, 1.0f));
  tape.backward(ops.scale(b.tensor(), -2.0f), Tensor::full({6}, 1.0f));
  EXPECT_EQ(flat.to_vector(), (std::vector<float>{3, 3, 3, 3, -2, -2, -2, -2, -2, -2}));
  EXPECT_THROW(a.set_grad_buffer(Tensor::zeros({4})), InternalError);
}

TEST_F(Autograd, FrozenInputsGetNoGradient) {
  Parameter x("x", random_tensor({4, 6}, 7)), w("w", random_tensor({5, 6}, 8));
  w.set_requires_grad(false);
  Tape tape;
  Ops ops(*cpu_, &tape);
  tape.backward(ops.linear(x.tensor(), w.tensor()), Tensor::full({4, 5}, 1.0f));
  EXPECT_TRUE(x.has_grad());
  EXPECT_FALSE(w.has_grad());
}

TEST_F(Autograd, ContiguousCopiesAreRecorded) {
  Parameter x("x", Tensor::full({3, 4}, 1.0f));
  Tape tape;
  Ops ops(*cpu_, &tape);
  Tensor c = ops.contiguous(x.tensor().select(1, 2));  // a column: stride 4
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_TRUE(ops.contiguous(c).shares_storage_with(c));
  tape.backward(c, values({1, 2, 3}, {3}));
  EXPECT_EQ(x.grad().to_vector(), (std::vector<float>{0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0}));
}

TEST_F(Autograd, BackwardReleasesTheGraph) {
  Parameter w("w", random_tensor({64, 64}, 9));
  Tape tape;
  Ops ops(*cpu_, &tape);
  // Warm up so that the parameter's gradient buffer exists.
  tape.backward(ops.gelu(w.tensor()), Tensor::full({64, 64}, 1.0f));
  const std::size_t base = allocator_stats().bytes_in_use;
  Tensor h = w.tensor();
  for (int i = 0; i < 10; ++i) h = ops.gelu(ops.scale(h, 0.9f));
  EXPECT_EQ(tape.size(), 20u);
  // Each gelu keeps its input alive for its backward; scale keeps nothing.
  EXPECT_GE(allocator_stats().bytes_in_use, base + 10 * 64 * 64 * 4);
  Tensor seed = Tensor::full({64, 64}, 1.0f);
  tape.backward(h, seed);
  h.reset();
  seed.reset();
  EXPECT_EQ(allocator_stats().bytes_in_use, base);
  EXPECT_EQ(tape.size(), 0u);
}

TEST_F(Autograd, ShapeErrorsNameTheOperation) {
  Ops ops(*cpu_);
  try {
    ops.linear(Tensor::zeros({2, 3}), Tensor::zeros({4, 5}));
    FAIL() << "expected an error";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("linear: x has 3 features"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ops.add(Tensor::zeros({2}), Tensor::zeros({3})), InternalError);
  EXPECT_THROW(ops.embedding(Tensor::zeros({4, 2}),
                             Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{4}), Shape{1})),
               InternalError);
  EXPECT_THROW(
      ops.cross_entropy(Tensor::zeros({2, 3}),
                        Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{0, 3}), Shape{2})),
      InternalError);
  EXPECT_THROW(ops.matmul(Tensor::zeros({2, 3}), Tensor::zeros({2, 3})), InternalError);
  EXPECT_THROW(ops.dropout(Tensor::zeros({2}), 1.5f), InternalError);
}

TEST_F(Autograd, DropoutIsSeededAndIdentityWhenOff) {
  Ops ops(*cpu_);
  const Tensor x = Tensor::full({1000}, 1.0f);
  ops.set_dropout_seed(1, 0);
  const std::vector<float> a = ops.dropout(x, 0.5f).to_vector();
  const std::vector<float> a2 = ops.dropout(x, 0.5f).to_vector();  // the next call: another mask
  ops.set_dropout_seed(1, 0);
  EXPECT_EQ(ops.dropout(x, 0.5f).to_vector(), a);  // same seed and step: same mask
  ops.set_dropout_seed(1, 1);
  EXPECT_NE(ops.dropout(x, 0.5f).to_vector(), a);
  EXPECT_NE(a, a2);
  const auto zeros = std::count(a.begin(), a.end(), 0.0f);
  EXPECT_GT(zeros, 400);
  EXPECT_LT(zeros, 600);
  for (float v : a) EXPECT_TRUE(v == 0.0f || v == 2.0f);
  EXPECT_EQ(ops.dropout(x, 1.0f).to_vector(), std::vector<float>(1000, 0.0f));
  EXPECT_TRUE(ops.dropout(x, 0.0f).shares_storage_with(x));
  ops.set_training(false);
  EXPECT_TRUE(ops.dropout(x, 0.5f).shares_storage_with(x));
}

TEST_F(Autograd, CrossEntropyTurnsUnsharedLogitsIntoTheirGradient) {
  const std::int64_t n = 64, dim = 16, vocab = 5003;
  Parameter x("x", random_tensor({n, dim}, 10)), w("w", random_tensor({vocab, dim}, 11, 0.2f));
  const Tensor targets = random_ids({n}, static_cast<std::int32_t>(vocab), 12);
  const std::size_t logits_bytes = static_cast<std::size_t>(n * vocab) * 4;
  Tape tape;
  Ops ops(*cpu_, &tape);
  auto peak_of_backward = [&](bool keep_logits) {
    Tensor logits = ops.linear(x.tensor(), w.tensor());
    Tensor loss = ops.cross_entropy(logits, targets);
    if (!keep_logits) logits.reset();
    const std::size_t before = allocator_stats().bytes_in_use;
    allocator_reset_peak();
    tape.backward(loss);
    return allocator_stats().peak_bytes_in_use - before;
  };
  peak_of_backward(false);  // warm-up: the parameters' gradient buffers
  const std::vector<float> g1 = w.grad().to_vector();
  x.zero_grad();
  w.zero_grad();
  EXPECT_LT(peak_of_backward(false), logits_bytes / 2);
  EXPECT_TRUE(all_close(w.grad().to_vector(), g1, 1e-6));
  x.zero_grad();
  w.zero_grad();
  EXPECT_GE(peak_of_backward(true), logits_bytes);  // a kept handle forces a separate gradient
  EXPECT_TRUE(all_close(w.grad().to_vector(), g1, 1e-6));
}

TEST_F(Autograd, LinearCrossEntropyMatchesTheUnfusedPathInBoundedMemory) {
  const std::int64_t n = 45, dim = 24, vocab = 4099;
  const Tensor x0 = random_tensor({3, 15, dim}, 13), w0 = random_tensor({vocab, dim}, 14, 0.3f);
  Tensor targets = random_ids({3, 15}, static_cast<std::int32_t>(vocab), 15);
  targets.data<std::int32_t>()[4] = -100;
  auto run = [&](std::int64_t chunk) {
    Parameter x("x", x0.clone()), w("w", w0.clone());
    Tape tape;
    Ops ops(*cpu_, &tape);
    const std::size_t before = allocator_stats().bytes_in_use;
    allocator_reset_peak();
    Tensor loss = chunk < 0 ? ops.cross_entropy(ops.linear(x.tensor(), w.tensor()), targets)
                            : ops.linear_cross_entropy(x.tensor(), w.tensor(), targets, {.chunk_tokens = chunk});
    const std::size_t peak = allocator_stats().peak_bytes_in_use - before;
    const float value = loss.item();
    tape.backward(loss, 2.0f);
    return std::make_tuple(value, x.grad().to_vector(), w.grad().to_vector(), peak);
  };
  const auto [l0, gx0, gw0, peak0] = run(-1);
  for (std::int64_t chunk : {1, 4, 0}) {
    const auto [l, gx, gw, peak] = run(chunk);
    EXPECT_NEAR(l, l0, 1e-5 * std::fabs(l0));
    EXPECT_TRUE(all_close(gx, gx0, 1e-5));
    EXPECT_TRUE(all_close(gw, gw0, 1e-5));
    if (chunk == 4) {
      // Never the whole logits: one chunk, the kept gradients (x and W sized) and small rows.
      const std::size_t chunk_logits = static_cast<std::size_t>(4 * vocab) * 4;
      EXPECT_LT(peak, chunk_logits * 2 + static_cast<std::size_t>((n + vocab) * dim) * 4 + 4096);
      EXPECT_LT(peak, peak0);
    }
  }
}

// z-loss: the loss gains w * mean over counted targets of lse^2 and the logits' gradient
// g (softmax (1 + 2 w lse) - onehot) / count, written out in double here; the fused linear path
// agrees with the plain one, and a weight of 0 changes nothing.
TEST_F(Autograd, ZLossAddsTheSquaredLogNormaliserAndItsGradient) {
  const std::int64_t rows = 6, vocab = 11;
  const Tensor logits0 = random_tensor({rows, vocab}, 21, 3.0f);
  Tensor targets = random_ids({rows}, static_cast<std::int32_t>(vocab), 22);
  targets.data<std::int32_t>()[2] = -100;
  const float w = 0.25f;
  const std::vector<float> l = logits0.to_vector();
  const std::int32_t* t = targets.data<std::int32_t>();
  double ce = 0, z = 0;
  std::vector<double> want(l.size(), 0.0);
  const double count = rows - 1;
  for (std::int64_t r = 0; r < rows; ++r) {
    if (t[r] == -100) continue;
    double sum = 0;
    for (std::int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(l[r * vocab + j]));
    const double lse = std::log(sum);
    ce += lse - l[r * vocab + t[r]];
    z += lse * lse;
    for (std::int64_t j = 0; j < vocab; ++j) {
      const double p = std::exp(l[r * vocab + j] - lse);
      want[r * vocab + j] = 2.0 * (p * (1 + 2 * w * lse) - (j == t[r] ? 1.0 : 0.0)) / count;
    }
  }
  for (bool weighted : {false, true}) {
    Parameter x("logits", logits0.clone());
    Tape tape;
    Ops ops(*cpu_, &tape);
    if (weighted) ops.set_z_loss_weight(w);
    Tensor loss = ops.cross_entropy(x.tensor(), targets);
    const double expected = (ce + (weighted ? w * z : 0.0)) / count;
    EXPECT_NEAR(loss.item(), expected, 1e-5 * std::fabs(expected));
    tape.backward(loss, 2.0f);
    if (!weighted) continue;  // the plain gradient is checked above
    const std::vector<float> got = x.grad().to_vector();
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
  // The fused projection + loss gives the same value and gradients as the plain path.
  const Tensor x0 = random_tensor({rows, 8}, 23), w0 = random_tensor({vocab, 8}, 24, 0.5f);
  auto run = [&](bool fused) {
    Parameter x("x", x0.clone()), wt("w", w0.clone());
    Tape tape;
    Ops ops(*cpu_, &tape);
    ops.set_z_loss_weight(w);
    Tensor loss = fused ? ops.linear_cross_entropy(x.tensor(), wt.tensor(), targets, {.chunk_tokens = 4})
                        : ops.cross_entropy(ops.linear(x.tensor(), wt.tensor()), targets);
    const float value = loss.item();
    tape.backward(loss);
    return std::make_tuple(value, x.grad().to_vector(), wt.grad().to_vector());
  };
  const auto [l0, gx0, gw0] = run(false);
  const auto [l1, gx1, gw1] = run(true);
  EXPECT_NEAR(l1, l0, 1e-5 * std::fabs(l0));
  EXPECT_TRUE(all_close(gx1, gx0, 1e-5));
  EXPECT_TRUE(all_close(gw1, gw0, 1e-5));
}

}  // namespace
}  // namespace loom::test
