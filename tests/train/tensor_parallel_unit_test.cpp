// The trainer's reading of a model's parallel plan (core/run/src/train/tensor_parallel.cpp) on a
// group of one and on a fake group of two whose other member's shard the test supplies: a model
// without a plan is one error naming it, a plan that leaves out a parameter or disagrees with the
// allocated shapes is an internal error, checkpoint entries are gathered whole and split back.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <optional>

#include "loom/error.hpp"
#include "train/tensor_parallel.hpp"

namespace loom::training {
namespace {

// A model of named parameters and an optional plan; nothing runs it.
class PlannedModel final : public Model {
 public:
  std::deque<Parameter> params;
  std::optional<std::vector<PlannedParameter>> plan;

  void build(const ModelSetup&) override {}
  void initialize(std::uint64_t) override {}
  std::vector<ModelParameter> parameters() override {
    std::vector<ModelParameter> out;
    for (auto& p : params) out.push_back({&p});
    return out;
  }
  std::int64_t vocab_size() const override { return 1; }
  std::int64_t max_seq_len() const override { return 1; }
  std::int64_t num_parameters() const override { return 0; }
  double flops_per_token(std::int64_t) const override { return 0; }
  Tensor loss(Ops&, const Tensor&, const Tensor&, const Tensor&) override { return {}; }
  Tensor logits(Ops&, const Tensor&, const Tensor&) override { return {}; }
  std::unique_ptr<KvCache> new_cache(std::int64_t, std::int64_t) override { return nullptr; }
  Tensor next_logits(Ops&, const Tensor&, KvCache&) override { return {}; }
  std::optional<std::vector<PlannedParameter>> parallel_plan() override { return plan; }
};

// Member `rank` of a group of two whose other member holds `other` (its all-gather contribution).
class PairGroup final : public CollectiveGroup {
 public:
  PairGroup(int rank, std::vector<float> other) : rank_(rank), other_(std::move(other)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  void all_reduce(std::span<float> data, ReduceOp) override {
    for (float& v : data) v *= 2;  // the other member's part equals this one's
  }
  void all_reduce(std::span<double> data, ReduceOp) override {
    for (double& v : data) v *= 2;
  }
  void reduce_scatter(std::span<const float>, std::span<float>) override { throw InternalError("unused"); }
  void all_gather(std::span<const float> in, std::span<float> out) override {
    const std::size_t n = in.size();
    std::memcpy(out.data() + rank_ * n, in.data(), n * sizeof(float));
    std::memcpy(out.data() + (1 - rank_) * n, other_.data(), n * sizeof(float));
  }
  void broadcast(std::span<std::byte>, int) override {}
  void barrier() override {}
  std::unique_ptr<Pending> start_all_reduce(std::span<float>) override { throw InternalError("unused"); }

 private:
  int rank_;
  std::vector<float> other_;
};

TEST(TensorParallelPlan, AModelWithoutAPlanIsOneErrorNamingIt) {
  PlannedModel model;
  model.params.emplace_back("w", Tensor::zeros(Shape{2, 2}));
  try {
    TensorParallel tp(std::make_shared<PairGroup>(0, std::vector<float>{}), model, "mymodel");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.mesh.tensor is 2 but the model (mymodel) declares no parallel plan"),
              std::string::npos)
        << e.what();
  }
}

TEST(TensorParallelPlan, APlanThatLeavesOutAParameterOrDisagreesWithItsShapeIsRefused) {
  PlannedModel model;
  Parameter& a = model.params.emplace_back("a", Tensor::zeros(Shape{2, 3}));
  model.params.emplace_back("b", Tensor::zeros(Shape{3}));
  model.plan = std::vector<PlannedParameter>{{&a, Shape{4, 3}, TensorPlacement::split_along(0, "column")}};
  EXPECT_THROW(TensorParallel(std::make_shared<PairGroup>(0, std::vector<float>{}), model, "m"), InternalError);
  model.plan->push_back({&model.params[1], Shape{3}, TensorPlacement::replicated()});
  EXPECT_NO_THROW(TensorParallel(std::make_shared<PairGroup>(0, std::vector<float>{}), model, "m"));
  (*model.plan)[0].whole = Shape{6, 3};  // member 0 of 2 would hold 3 rows, not 2
  EXPECT_THROW(TensorParallel(std::make_shared<PairGroup>(0, std::vector<float>{}), model, "m"), InternalError);
}

TEST(TensorParallelPlan, EntriesAreGatheredWholeAndSplitBack) {
  // A row-parallel [2, 4] split along dim 1: member 1 holds columns 2..3.
  PlannedModel model;
  Parameter& w = model.params.emplace_back("w", Tensor::from(std::vector<float>{12, 13, 16, 17}, Shape{2, 2}));
  Parameter& n = model.params.emplace_back("n", Tensor::from(std::vector<float>{1, 2}, Shape{2}));
  model.plan = std::vector<PlannedParameter>{{&w, Shape{2, 4}, TensorPlacement::split_along(1, "row")},
                                             {&n, Shape{2}, TensorPlacement::replicated()}};
  TensorParallel tp(std::make_shared<PairGroup>(1, std::vector<float>{10, 11, 14, 15}), model, "m");
  EXPECT_TRUE(tp.is_split(&w));
  EXPECT_FALSE(tp.is_split(&n));
  const Tensor whole = tp.whole("exp_avg/w", w.data());
  EXPECT_EQ(whole.shape(), (Shape{2, 4}));
  EXPECT_EQ(whole.to_vector(), (std::vector<float>{10, 11, 12, 13, 14, 15, 16, 17}));
  EXPECT_EQ(tp.whole_shape("w", Shape{2, 2}), (Shape{2, 4}));
  EXPECT_EQ(tp.whole_shape("n", Shape{2}), (Shape{2}));
  EXPECT_EQ(tp.shard("ema/w", whole).to_vector(), (std::vector<float>{12, 13, 16, 17}));
  EXPECT_EQ(tp.whole("n", n.data()).to_vector(), (std::vector<float>{1, 2})) << "replicated: as it is";
  EXPECT_EQ(tp.sum_over_members(1.5), 3.0);
  EXPECT_NE(tp.describe().find("tensor 2: 1 of 2 parameters split (row)"), std::string::npos) << tp.describe();
}

}  // namespace
}  // namespace loom::training
