// Tensor parallelism's operations (Ops::tensor_copy, tensor_reduce, tensor_all_gather,
// tensor_reduce_scatter, embedding_vocab_parallel, the vocabulary-parallel linear_cross_entropy)
// against the same computation on whole tensors, values and gradients: every rank of
// `mpirun -np N` is one member of a tensor group of N (LOOM_TEST_COLLECTIVE=mpi), and computes
// both the split form (its shards, parallel_plan.hpp's layout) and the whole form, which must
// agree to float32 rounding. One process (`single`) runs them as a group of one.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/parallel_plan.hpp"
#include "numerics_test_support.hpp"
#include "tensor_group_support.hpp"

namespace {

using namespace loom;
using loom::test::all_close;
using loom::test::random_ids;
using loom::test::random_tensor;

using loom::test::tensor_group::backend;
using loom::test::tensor_group::collective;

int rank() {
  return collective().rank();
}
int size() {
  return collective().size();
}

// This member's shard of `whole` as a new tensor.
Tensor shard_of(const Tensor& whole, const TensorPlacement& p) {
  Tensor out = Tensor::zeros(tensor_plan::shard_shape(whole.shape(), p, rank(), size()));
  tensor_plan::extract_shard(whole.data<float>(), whole.shape(), p, rank(), size(), out.data<float>());
  return out;
}
std::vector<float> shard_values(const Tensor& whole, const TensorPlacement& p) {
  return shard_of(whole, p).to_vector();
}

constexpr double kTol = 2e-5;

TEST(TensorParallelOps, ColumnThenRowParallelMlpEqualsTheWholeOne) {
  const std::int64_t n = 6, c = 8, f = 4 * size();
  const Tensor w1_whole = random_tensor(Shape{f, c}, 1, 0.3f), w2_whole = random_tensor(Shape{c, f}, 2, 0.3f);
  const Tensor x_whole = random_tensor(Shape{n, c}, 3), r = random_tensor(Shape{n, c}, 4);
  const TensorPlacement column = TensorPlacement::split_along(0, "column"),
                        row = TensorPlacement::split_along(1, "row");

  // Whole: y = W2 gelu(W1 x); loss = sum(y * r).
  Parameter w1("w1", w1_whole.clone()), w2("w2", w2_whole.clone()), x("x", x_whole.clone());
  Tape tape;
  Ops ops(backend(), &tape);
  const Tensor y = ops.linear(ops.gelu(ops.linear(x.tensor(), w1.tensor())), w2.tensor());
  tape.backward(ops.sum(ops.mul(y, r)));

  Parameter w1s("w1", shard_of(w1_whole, column)), w2s("w2", shard_of(w2_whole, row)), xs("x", x_whole.clone());
  Tape tape2;
  Ops tp(backend(), &tape2);
  tp.set_tensor_group(&collective());
  EXPECT_EQ(tp.tensor_size(), size());
  EXPECT_EQ(tp.tensor_rank(), rank());
  const Tensor ys =
      tp.tensor_reduce(tp.linear(tp.gelu(tp.linear(tp.tensor_copy(xs.tensor()), w1s.tensor())), w2s.tensor()));
  tape2.backward(tp.sum(tp.mul(ys, r)));

  EXPECT_TRUE(all_close(ys.to_vector(), y.to_vector(), kTol));
  EXPECT_TRUE(all_close(xs.grad().to_vector(), x.grad().to_vector(), kTol)) << "x's gradient: f's all-reduce";
  EXPECT_TRUE(all_close(w1s.grad().to_vector(), shard_values(w1.grad(), column), kTol));
  EXPECT_TRUE(all_close(w2s.grad().to_vector(), shard_values(w2.grad(), row), kTol));
}

TEST(TensorParallelOps, AllGatherAndReduceScatterAlongADimAreEachOthersAdjoint) {
  const std::int64_t a = 3, b = 2 * size(), c = 5;
  const Tensor whole = random_tensor(Shape{a, b, c}, 5), r = random_tensor(Shape{a, b, c}, 6);
  const TensorPlacement along1 = TensorPlacement::split_along(1, "sequence");
  Parameter xs("x", shard_of(whole, along1));
  Tape tape;
  Ops tp(backend(), &tape);
  tp.set_tensor_group(&collective());
  const Tensor gathered = tp.tensor_all_gather(xs.tensor(), 1);
  EXPECT_EQ(gathered.shape(), whole.shape());
  EXPECT_EQ(gathered.to_vector(), whole.to_vector()) << "the members' shards in rank order";
  // loss = sum(gathered * r): each member's gradient is the sum over members of its slice of r.
  tape.backward(tp.sum(tp.mul(gathered, r)));
  std::vector<float> expected = shard_values(r, along1);
  for (float& v : expected) v *= static_cast<float>(size());
  EXPECT_TRUE(all_close(xs.grad().to_vector(), expected, kTol));

  // reduce_scatter of a tensor every member holds alike: size() times this member's slice; its
  // backward pass all-gathers.
  Parameter y("y", whole.clone());
  Tape tape2;
  Ops tp2(backend(), &tape2);
  tp2.set_tensor_group(&collective());
  const Tensor scattered = tp2.tensor_reduce_scatter(y.tensor(), 1);
  std::vector<float> sum_slice = shard_values(whole, along1);
  for (float& v : sum_slice) v *= static_cast<float>(size());
  EXPECT_TRUE(all_close(scattered.to_vector(), sum_slice, kTol));
  const Tensor rs = shard_of(r, along1);
  tape2.backward(tp2.sum(tp2.mul(scattered, rs)));
  EXPECT_TRUE(all_close(y.grad().to_vector(), r.to_vector(), kTol)) << "the members' slices of r, gathered";
}

TEST(TensorParallelOps, VocabularyParallelEmbeddingEqualsTheWholeLookup) {
  const std::int64_t vocab = 7 * size() + 1, dim = 6;  // an uneven split
  const Tensor table_whole = random_tensor(Shape{vocab, dim}, 7);
  const Tensor ids = random_ids(Shape{3, 5}, static_cast<std::int32_t>(vocab), 8),
               r = random_tensor(Shape{3, 5, dim}, 9);
  const TensorPlacement by_vocab = TensorPlacement::split_along(0, "vocab");
  Parameter t("t", table_whole.clone());
  Tape tape;
  Ops ops(backend(), &tape);
  const Tensor e = ops.embedding(t.tensor(), ids);
  tape.backward(ops.sum(ops.mul(e, r)));

  Parameter ts("t", shard_of(table_whole, by_vocab));
  Tape tape2;
  Ops tp(backend(), &tape2);
  tp.set_tensor_group(&collective());
  const Tensor es = tp.embedding_vocab_parallel(ts.tensor(), ids, tensor_plan::split_begin(vocab, rank(), size()));
  tape2.backward(tp.sum(tp.mul(es, r)));
  EXPECT_EQ(es.to_vector(), e.to_vector()) << "one member's row plus zeros: exact";
  EXPECT_TRUE(all_close(ts.grad().to_vector(), shard_values(t.grad(), by_vocab), kTol));
}

struct CeCase {
  const char* name;
  Reduction reduction;
  float softcap;
  float z_loss;
};

class VocabParallelCrossEntropy : public ::testing::TestWithParam<CeCase> {};

TEST_P(VocabParallelCrossEntropy, EqualsTheWholeVocabularysLossAndGradients) {
  const CeCase k = GetParam();
  const std::int64_t rows = 13, dim = 8, vocab = 9 * size() + 3;
  const Tensor w_whole = random_tensor(Shape{vocab, dim}, 10, 0.5f), x_whole = random_tensor(Shape{rows, dim}, 11);
  std::vector<std::int32_t> t(static_cast<std::size_t>(rows));
  const auto ids = random_ids(Shape{rows}, static_cast<std::int32_t>(vocab), 12).to_int_vector();
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = i % 5 == 4 ? -1 : ids[i];
  const Tensor targets = Tensor::from(std::span<const std::int32_t>(t), Shape{rows});
  const TensorPlacement by_vocab = TensorPlacement::split_along(0, "vocab");
  CrossEntropyOptions ce;
  ce.ignore_index = -1;
  ce.reduction = k.reduction;
  ce.logit_softcap = k.softcap;
  ce.chunk_tokens = 4;  // several chunks
  const Tensor seeds = random_tensor(Shape{rows}, 13);

  Parameter w("w", w_whole.clone()), x("x", x_whole.clone());
  Tape tape;
  Ops ops(backend(), &tape);
  ops.set_z_loss_weight(k.z_loss);
  const Tensor loss = ops.linear_cross_entropy(x.tensor(), w.tensor(), targets, ce);
  if (k.reduction == Reduction::none)
    tape.backward(loss, seeds);
  else
    tape.backward(loss);

  Parameter ws("w", shard_of(w_whole, by_vocab)), xs("x", x_whole.clone());
  Tape tape2;
  Ops tp(backend(), &tape2);
  tp.set_tensor_group(&collective());
  tp.set_z_loss_weight(k.z_loss);
  CrossEntropyOptions vp = ce;
  vp.vocab_size = vocab;
  vp.vocab_begin = tensor_plan::split_begin(vocab, rank(), size());
  const Tensor loss_s = tp.linear_cross_entropy(tp.tensor_copy(xs.tensor()), ws.tensor(), targets, vp);
  if (k.reduction == Reduction::none)
    tape2.backward(loss_s, seeds);
  else
    tape2.backward(loss_s);

  EXPECT_TRUE(all_close(loss_s.to_vector(), loss.to_vector(), kTol));
  EXPECT_TRUE(all_close(xs.grad().to_vector(), x.grad().to_vector(), kTol));
  EXPECT_TRUE(all_close(ws.grad().to_vector(), shard_values(w.grad(), by_vocab), kTol));
}

INSTANTIATE_TEST_SUITE_P(Variants, VocabParallelCrossEntropy,
                         ::testing::Values(CeCase{"mean", Reduction::mean, 0.0f, 0.0f},
                                           CeCase{"sum", Reduction::sum, 0.0f, 0.0f},
                                           CeCase{"none", Reduction::none, 0.0f, 0.0f},
                                           CeCase{"mean_softcap", Reduction::mean, 5.0f, 0.0f},
                                           CeCase{"mean_z_loss", Reduction::mean, 0.0f, 1e-2f},
                                           CeCase{"none_softcap_z_loss", Reduction::none, 5.0f, 1e-2f}),
                         [](const ::testing::TestParamInfo<CeCase>& info) { return std::string(info.param.name); });

TEST(TensorParallelPlan, ShardsOfPartsCoverTheWholeTensorOnce) {
  // A fused [q | k | v] projection of 8 + 4 + 4 rows, split in 2 and 4: every element once.
  const Shape whole{16, 3};
  const TensorPlacement qkv = TensorPlacement::split_along(0, "column", {8, 4, 4});
  for (int t : {1, 2, 4}) {
    std::vector<int> seen(static_cast<std::size_t>(whole.numel()), 0);
    for (int r = 0; r < t; ++r) {
      const Shape s = tensor_plan::shard_shape(whole, qkv, r, t);
      EXPECT_EQ(s, (Shape{16 / t, 3}));
      const auto idx = tensor_plan::global_indices(whole, qkv, r, t);
      ASSERT_EQ(static_cast<std::int64_t>(idx.size()), s.numel());
      for (const auto i : idx) ++seen[static_cast<std::size_t>(i)];
    }
    for (const int n : seen) EXPECT_EQ(n, 1);
  }
  // Member 1 of 2 holds q rows 4..7, k rows 10..11, v rows 14..15.
  const auto idx = tensor_plan::global_indices(whole, qkv, 1, 2);
  EXPECT_EQ(idx.front(), 4 * 3);
  EXPECT_EQ(idx[4 * 3], 10 * 3);
  EXPECT_EQ(idx[6 * 3], 14 * 3);
  // A row-parallel split along dim 1 of [2, 6] in 3: columns 2..3 of each row.
  EXPECT_EQ(tensor_plan::global_indices(Shape{2, 6}, TensorPlacement::split_along(1, "row"), 1, 3),
            (std::vector<std::int64_t>{2, 3, 8, 9}));
  EXPECT_EQ(tensor_plan::shard_shape(Shape{5, 2}, TensorPlacement::replicated(), 1, 2), (Shape{5, 2}));
}

}  // namespace
