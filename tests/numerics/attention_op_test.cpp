// The attention contract's semantics, checked on the naive kernel (which the attention kernel
// conformance suite then holds every real kernel to), and the attention operation's plumbing.
#include <gtest/gtest.h>

#include <cmath>
#include <loom/error.hpp>

#include "numerics_test_support.hpp"

namespace loom::test {
namespace {

class AttentionOp : public ::testing::Test {
 protected:
  Handle<Backend> backend_ = make_backend("reference");
  NaiveAttention kernel_;
  Ops ops_{*backend_};

  Tensor attend(const Tensor& q, const Tensor& k, const Tensor& v, AttentionParams p = {}, const Tensor& qs = {},
                const Tensor& ks = {}) {
    return ops_.attention(kernel_, q, k, v, p, qs, ks);
  }
};

Tensor ids(std::vector<std::int32_t> v, const Shape& s) {
  return Tensor::from(std::span<const std::int32_t>(v), s);
}

TEST_F(AttentionOp, PackedDocumentsDoNotAttendAcrossSegments) {
  const Tensor q = random_tensor({1, 8, 2, 4}, 1), k = random_tensor({1, 8, 2, 4}, 2),
               v = random_tensor({1, 8, 2, 4}, 3);
  const Tensor seg = ids({0, 0, 0, 1, 1, 1, 1, 1}, {1, 8});
  const Tensor packed = attend(q, k, v, {}, seg, seg);
  // The second document alone.
  const Tensor alone = attend(q.slice(1, 3, 8), k.slice(1, 3, 8), v.slice(1, 3, 8));
  EXPECT_TRUE(all_close(packed.slice(1, 3, 8).to_vector(), alone.to_vector(), 1e-6));
  const Tensor first = attend(q.slice(1, 0, 3), k.slice(1, 0, 3), v.slice(1, 0, 3));
  EXPECT_TRUE(all_close(packed.slice(1, 0, 3).to_vector(), first.to_vector(), 1e-6));
}

TEST_F(AttentionOp, SlidingWindowSeesOnlyTheLastWindowPositions) {
  const std::int64_t t = 9, w = 3;
  const Tensor q = random_tensor({1, t, 1, 5}, 4), k = random_tensor({1, t, 1, 5}, 5),
               v = random_tensor({1, t, 1, 5}, 6);
  const Tensor windowed = attend(q, k, v, {.causal = true, .window = w});
  for (std::int64_t i = 0; i < t; ++i) {
    const std::int64_t lo = std::max<std::int64_t>(0, i - w + 1);
    // Query i alone against keys [lo, i]: a one-query "cache" problem.
    const Tensor one = attend(q.slice(1, i, i + 1), k.slice(1, lo, i + 1), v.slice(1, lo, i + 1));
    EXPECT_TRUE(all_close(windowed.slice(1, i, i + 1).to_vector(), one.to_vector(), 1e-6)) << "query " << i;
  }
}

TEST_F(AttentionOp, GroupedQueryAttentionSharesKeyValueHeads) {
  const Tensor q = random_tensor({2, 6, 4, 3}, 7), k = random_tensor({2, 6, 2, 3}, 8),
               v = random_tensor({2, 6, 2, 3}, 9);
  // Repeat each kv head for its group of two query heads.
  Tensor k4 = Tensor::empty({2, 6, 4, 3}), v4 = Tensor::empty({2, 6, 4, 3});
  for (std::int64_t h = 0; h < 4; ++h) {
    k4.select(2, h).copy_from(k.select(2, h / 2));
    v4.select(2, h).copy_from(v.select(2, h / 2));
  }
  EXPECT_TRUE(all_close(attend(q, k, v).to_vector(), attend(q, k4, v4).to_vector(), 1e-6));
}

TEST_F(AttentionOp, SoftCapBoundsTheScores) {
  // One query, two keys: out = softmax(cap * tanh(s / cap)) . v
  const Tensor q = Tensor::from(std::span<const float>(std::vector<float>{2, 0}), Shape{1, 1, 1, 2});
  const Tensor k = Tensor::from(std::span<const float>(std::vector<float>{3, 0, -1, 0}), Shape{1, 2, 1, 2});
  const Tensor v = Tensor::from(std::span<const float>(std::vector<float>{1, 0, 0, 1}), Shape{1, 2, 1, 2});
  const float cap = 2.0f, scale = 1.0f;
  const double s0 = cap * std::tanh(6.0 / cap), s1 = cap * std::tanh(-2.0 / cap);
  const double p0 = 1.0 / (1.0 + std::exp(s1 - s0));
  const std::vector<float> out = attend(q, k, v, {.causal = false, .softcap = cap, .scale = scale}).to_vector();
  EXPECT_NEAR(out[0], p0, 1e-6);
  EXPECT_NEAR(out[1], 1.0 - p0, 1e-6);
}

TEST_F(AttentionOp, CachedQueriesAreTheLastPositions) {
  const Tensor q = random_tensor({1, 7, 2, 4}, 10), k = random_tensor({1, 7, 2, 4}, 11),
               v = random_tensor({1, 7, 2, 4}, 12);
  const Tensor full = attend(q, k, v);
  const Tensor tail = attend(q.slice(1, 4, 7), k, v);
  EXPECT_TRUE(all_close(tail.to_vector(), full.slice(1, 4, 7).to_vector(), 1e-6));
}

TEST_F(AttentionOp, ARowWithNoVisibleKeyIsZeroAndGetsNoGradient) {
  Parameter q("q", random_tensor({1, 2, 1, 3}, 13)), k("k", random_tensor({1, 4, 1, 3}, 14)),
      v("v", random_tensor({1, 4, 1, 3}, 15));
  Tape tape;
  Ops ops(*backend_, &tape);
  // Query segment 9 has no key.
  Tensor out =
      ops.attention(kernel_, q.tensor(), k.tensor(), v.tensor(), {}, ids({0, 9}, {1, 2}), ids({0, 0, 0, 0}, {1, 4}));
  const std::vector<float> o = out.to_vector();
  for (int d = 3; d < 6; ++d) EXPECT_EQ(o[static_cast<std::size_t>(d)], 0.0f);
  tape.backward(out, Tensor::full({1, 2, 1, 3}, 1.0f));
  const std::vector<float> gq = q.grad().to_vector();
  for (int d = 3; d < 6; ++d) EXPECT_EQ(gq[static_cast<std::size_t>(d)], 0.0f);
}

TEST_F(AttentionOp, GradientsOfAFusedProjectionLandInItsSlices) {
  Parameter qkv("qkv", random_tensor({2, 5, 4, 3}, 16));  // q: heads 0-1, k: 2, v: 3
  Tape tape;
  Ops ops(*backend_, &tape);
  const Tensor t = qkv.tensor();
  Tensor out = ops.attention(kernel_, t.slice(2, 0, 2), t.slice(2, 2, 3), t.slice(2, 3, 4));
  tape.backward(out, random_tensor({2, 5, 2, 3}, 17));
  // Compare with separate parameters holding copies of the slices.
  Parameter q("q", t.slice(2, 0, 2).clone()), k("k", t.slice(2, 2, 3).clone()), v("v", t.slice(2, 3, 4).clone());
  Tensor out2 = ops.attention(kernel_, q.tensor(), k.tensor(), v.tensor());
  tape.backward(out2, random_tensor({2, 5, 2, 3}, 17));
  const Tensor g = qkv.grad();
  EXPECT_TRUE(all_close(g.slice(2, 0, 2).to_vector(), q.grad().to_vector(), 1e-6));
  EXPECT_TRUE(all_close(g.slice(2, 2, 3).to_vector(), k.grad().to_vector(), 1e-6));
  EXPECT_TRUE(all_close(g.slice(2, 3, 4).to_vector(), v.grad().to_vector(), 1e-6));
}

TEST_F(AttentionOp, InvalidArgumentsAreRejected) {
  const Tensor q = Tensor::zeros({1, 4, 3, 2}), kv = Tensor::zeros({1, 4, 2, 2});
  EXPECT_THROW(attend(q, kv, kv), InternalError);  // 3 query heads, 2 kv heads
  const Tensor q2 = Tensor::zeros({1, 4, 2, 2});
  EXPECT_THROW(attend(q2, kv, kv, {}, ids({0, 0, 0, 0}, {1, 4})), InternalError);  // one segment tensor
  EXPECT_THROW(attend(q2, kv, kv, {}, ids({0, 0}, {1, 2}), ids({0, 0}, {1, 2})), InternalError);
  EXPECT_THROW(attend(q2, kv, kv, {.window = -1}), InternalError);
  EXPECT_THROW(attend(Tensor::zeros({1, 5, 2, 2}), kv, kv), InternalError);  // more queries than keys
}

}  // namespace
}  // namespace loom::test
