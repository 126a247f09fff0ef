// The host-computed operations the newer model families use (mul, softcap, softmax, logsumexp,
// concat, sum, and linear_cross_entropy's logit_softcap): values by hand, gradients against
// central finite differences in double precision of the same function.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <loom/error.hpp>
#include <vector>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

Tensor values(std::vector<float> v, const Shape& s) {
  return Tensor::from(std::span<const float>(v), s);
}

std::vector<float> ramp(std::int64_t n, float scale, float offset) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = offset + scale * std::sin(1.7f * static_cast<float>(i) + 0.3f);
  return v;
}

class ElementwiseOps : public ::testing::Test {
 protected:
  // Checks d loss / d p for every parameter against central differences, where
  // loss = sum(f(ops, params) * weights) with fixed pseudo-random weights.
  void check_gradients(std::vector<Parameter*> params, const std::function<Tensor(Ops&)>& f) {
    Tape tape;
    Ops ops(*ref_, &tape);
    const Tensor y = f(ops);
    const std::vector<float> w = ramp(y.numel(), 1.0f, 0.2f);
    const Tensor weights = values(w, y.shape());
    tape.backward(y, weights);
    auto loss = [&] {
      Ops plain(*ref_);
      const auto out = f(plain).to_vector();
      double s = 0;
      for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
      return s;
    };
    for (Parameter* p : params) {
      ASSERT_TRUE(p->has_grad()) << p->name();
      const auto grad = p->grad().to_vector();
      float* data = p->data().data<float>();
      for (std::int64_t i = 0; i < p->data().numel(); ++i) {
        const float keep = data[i];
        const float h = 1e-2f;
        data[i] = keep + h;
        const double up = loss();
        data[i] = keep - h;
        const double down = loss();
        data[i] = keep;
        EXPECT_NEAR(grad[static_cast<std::size_t>(i)], (up - down) / (2 * h), 2e-3) << p->name() << "[" << i << "]";
      }
    }
  }

  Handle<Backend> ref_ = make_backend("reference");
};

TEST_F(ElementwiseOps, ValuesByHand) {
  Ops ops(*ref_);
  EXPECT_EQ(ops.mul(values({1, 2, 3}, {3}), values({4, 5, -1}, {3})).to_vector(), (std::vector<float>{4, 10, -3}));
  const auto capped = ops.softcap(values({0, 100, -1}, {3}), 2.0f).to_vector();
  EXPECT_FLOAT_EQ(capped[0], 0.0f);
  EXPECT_NEAR(capped[1], 2.0f, 1e-6);
  EXPECT_NEAR(capped[2], 2.0f * std::tanh(-0.5f), 1e-6);
  const auto p = ops.softmax(values({0, std::log(3.0f), 5, 5}, {2, 2})).to_vector();
  EXPECT_NEAR(p[0], 0.25f, 1e-6);
  EXPECT_NEAR(p[1], 0.75f, 1e-6);
  EXPECT_NEAR(p[2], 0.5f, 1e-6);
  const Tensor lse = ops.logsumexp(values({0, std::log(3.0f), 1000, 1000}, {2, 2}));
  EXPECT_EQ(lse.shape(), (Shape{2}));
  EXPECT_NEAR(lse.to_vector()[0], std::log(4.0f), 1e-6);
  EXPECT_NEAR(lse.to_vector()[1], 1000.0f + std::log(2.0f), 1e-3);  // no overflow
  const std::vector<Tensor> parts{values({1, 2}, {1, 2}), values({3, 4, 5, 6}, {2, 2})};
  const Tensor c = ops.concat(parts);
  EXPECT_EQ(c.shape(), (Shape{3, 2}));
  EXPECT_EQ(c.to_vector(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(ops.sum(c).item(), 21.0f);
}

TEST_F(ElementwiseOps, GradientsMatchFiniteDifferences) {
  Parameter a("a", values(ramp(12, 1.0f, 0.1f), {3, 4}));
  Parameter b("b", values(ramp(12, 0.7f, -0.2f), {3, 4}));
  Parameter c("c", values(ramp(8, 0.5f, 0.0f), {2, 4}));
  check_gradients({&a, &b}, [&](Ops& ops) { return ops.mul(a.tensor(), b.tensor()); });
  a.zero_grad();
  check_gradients({&a}, [&](Ops& ops) { return ops.mul(a.tensor(), a.tensor()); });  // both factors one tensor
  a.zero_grad();
  check_gradients({&a}, [&](Ops& ops) { return ops.softcap(ops.scale(a.tensor(), 3.0f), 1.5f); });
  a.zero_grad();
  check_gradients({&a}, [&](Ops& ops) { return ops.softmax(a.tensor()); });
  a.zero_grad();
  check_gradients({&a}, [&](Ops& ops) { return ops.logsumexp(a.tensor()); });
  a.zero_grad();
  b.zero_grad();
  check_gradients({&a, &c}, [&](Ops& ops) {
    const std::vector<Tensor> parts{a.tensor(), c.tensor(), a.tensor().slice(0, 1, 2)};
    return ops.concat(parts);
  });
  a.zero_grad();
  check_gradients({&a}, [&](Ops& ops) { return ops.sum(ops.mul(a.tensor(), a.tensor())); });
}

TEST_F(ElementwiseOps, LinearCrossEntropySoftcapMatchesTheUnfusedPath) {
  Parameter x("x", values(ramp(15, 2.0f, 0.0f), {5, 3}));
  Parameter w("w", values(ramp(21, 3.0f, 0.5f), {7, 3}));
  const Tensor targets = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{0, 6, -1, 3, 2}), {5});
  CrossEntropyOptions ce;
  ce.ignore_index = -1;
  ce.chunk_tokens = 2;
  Tape tape;
  Ops ops(*ref_, &tape);
  ce.logit_softcap = 4.0f;
  const Tensor fused = ops.linear_cross_entropy(x.tensor(), w.tensor(), targets, ce);
  tape.backward(fused);
  const auto fused_dx = x.grad().to_vector(), fused_dw = w.grad().to_vector();
  x.zero_grad();
  w.zero_grad();
  ce.logit_softcap = 0.0f;
  const Tensor plain = ops.cross_entropy(ops.softcap(ops.linear(x.tensor(), w.tensor()), 4.0f), targets, ce);
  tape.backward(plain);
  EXPECT_NEAR(fused.item(), plain.item(), 1e-5);
  const auto dx = x.grad().to_vector(), dw = w.grad().to_vector();
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(fused_dx[i], dx[i], 1e-5);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(fused_dw[i], dw[i], 1e-5);
}

// Reduction::none: one loss per target (0 where ignored), each with its own seed in the backward
// pass; fused (projecting again in the backward pass) and unfused agree, soft-capping and z-loss
// included, and the losses add up to Reduction::sum's.
TEST_F(ElementwiseOps, PerTargetLossesMatchTheUnfusedPathAndTheSum) {
  Parameter x("x", values(ramp(15, 2.0f, 0.0f), {5, 3}));
  Parameter w("w", values(ramp(21, 3.0f, 0.5f), {7, 3}));
  const Tensor targets = Tensor::from(std::span<const std::int32_t>(std::vector<std::int32_t>{0, 6, -1, 3, 2}), {5});
  const Tensor seed = values({0.5f, -1.0f, 2.0f, 0.25f, 1.5f}, {5});
  CrossEntropyOptions ce;
  ce.ignore_index = -1;
  ce.chunk_tokens = 2;
  ce.reduction = Reduction::none;
  Tape tape;
  Ops ops(*ref_, &tape);
  ops.set_z_loss_weight(0.01f);
  ce.logit_softcap = 4.0f;
  const Tensor fused = ops.linear_cross_entropy(x.tensor(), w.tensor(), targets, ce);
  const auto fused_values = fused.to_vector();
  tape.backward(fused, seed);
  const auto fused_dx = x.grad().to_vector(), fused_dw = w.grad().to_vector();
  x.zero_grad();
  w.zero_grad();
  ce.logit_softcap = 0.0f;
  const Tensor plain = ops.cross_entropy(ops.softcap(ops.linear(x.tensor(), w.tensor()), 4.0f), targets, ce);
  ASSERT_EQ(plain.shape(), targets.shape());
  const auto plain_values = plain.to_vector();
  tape.backward(plain, seed);
  EXPECT_EQ(fused_values[2], 0.0f) << "an ignored target's loss";
  for (std::size_t i = 0; i < plain_values.size(); ++i) EXPECT_NEAR(fused_values[i], plain_values[i], 1e-5);
  const auto dx = x.grad().to_vector(), dw = w.grad().to_vector();
  for (std::size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(fused_dx[i], dx[i], 1e-5);
  for (std::size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(fused_dw[i], dw[i], 1e-5);

  NoGradGuard guard(tape);
  ce.reduction = Reduction::sum;
  ce.logit_softcap = 4.0f;
  double total = 0;
  for (const float v : fused_values) total += v;
  EXPECT_NEAR(ops.linear_cross_entropy(x.tensor(), w.tensor(), targets, ce).item(), total, 1e-5);
}

TEST_F(ElementwiseOps, BadOperandsNameTheOperation) {
  Ops ops(*ref_);
  EXPECT_THROW(ops.mul(values({1, 2}, {2}), values({1, 2, 3}, {3})), InternalError);
  EXPECT_THROW(ops.softcap(values({1}, {1}), 0.0f), InternalError);
  const std::vector<Tensor> parts{values({1, 2}, {1, 2}), values({1, 2, 3}, {1, 3})};
  try {
    ops.concat(parts);
    FAIL() << "expected an InternalError";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("concat"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::test
