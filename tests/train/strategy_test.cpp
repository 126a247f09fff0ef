// The strategies' seam for checkpoints and the final weights (core/run/src/train/strategy.hpp):
// how the ranks write a checkpoint is the strategies' say combined, and an entry is made whole
// through each strategy in list order, each given what the ones before it made.
#include "train/strategy.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loom::training {
namespace {

// A strategy that says how checkpoints are written, and makes an entry whole by appending its
// mark to the tensor's values (a copy: [values..., mark]); it records what it was given.
class Fake final : public Strategy {
 public:
  Fake(CheckpointWriting writing, float mark) : writing_(writing), mark_(mark) {}
  CheckpointWriting checkpoint_writing() const override { return writing_; }
  std::optional<Tensor> whole(const std::string& name, const Tensor& t) override {
    seen.push_back(name + ":" + std::to_string(t.defined() ? t.numel() : -1));
    if (mark_ == 0) return std::nullopt;  // whole along its axis already
    const std::int64_t n = t.defined() ? t.numel() : 0;
    Tensor out = Tensor::zeros(Shape{n + 1});
    for (std::int64_t i = 0; i < n; ++i) out.data<float>()[i] = t.data<float>()[i];
    out.data<float>()[n] = mark_;
    return out;
  }
  std::vector<std::string> seen;

 private:
  CheckpointWriting writing_;
  float mark_;
};

Strategies of(std::vector<std::shared_ptr<Fake>> fakes) {
  return Strategies(fakes.begin(), fakes.end());
}

TEST(Strategies, WholeWinsOverPartsWhichWinOverACopy) {
  using W = CheckpointWriting;
  auto make = [](W w) { return std::make_shared<Fake>(w, 0.0f); };
  EXPECT_EQ(checkpoint_writing({}), W::copy);
  EXPECT_EQ(checkpoint_writing(of({make(W::copy), make(W::copy)})), W::copy);
  EXPECT_EQ(checkpoint_writing(of({make(W::copy), make(W::parts)})), W::parts);
  EXPECT_EQ(checkpoint_writing(of({make(W::parts), make(W::copy), make(W::whole)})), W::whole);
  EXPECT_EQ(checkpoint_writing(of({make(W::whole), make(W::parts)})), W::whole);
}

TEST(Strategies, AnEntryIsMadeWholeInListOrderEachGivenWhatTheOnesBeforeItMade) {
  auto first = std::make_shared<Fake>(CheckpointWriting::parts, 1.0f);
  auto whole_already = std::make_shared<Fake>(CheckpointWriting::copy, 0.0f);
  auto last = std::make_shared<Fake>(CheckpointWriting::whole, 2.0f);
  const Strategies strategies = of({first, whole_already, last});
  const Tensor t = Tensor::zeros(Shape{2});
  t.data<float>()[0] = 5;
  t.data<float>()[1] = 6;

  const std::optional<Tensor> w = make_whole(strategies, "exp_avg/w", t);
  ASSERT_TRUE(w.has_value());
  ASSERT_EQ(w->numel(), 4);
  EXPECT_EQ(w->data<float>()[0], 5);
  EXPECT_EQ(w->data<float>()[1], 6);
  EXPECT_EQ(w->data<float>()[2], 1);  // the first strategy's step, then the last's
  EXPECT_EQ(w->data<float>()[3], 2);
  EXPECT_EQ(first->seen, std::vector<std::string>{"exp_avg/w:2"});
  EXPECT_EQ(whole_already->seen, std::vector<std::string>{"exp_avg/w:3"});
  EXPECT_EQ(last->seen, std::vector<std::string>{"exp_avg/w:3"});
  EXPECT_EQ(t.numel(), 2);  // the rank's own tensor is left alone

  // A rank that holds none of the entry gives the first an undefined tensor.
  const std::optional<Tensor> none = make_whole(strategies, "w", Tensor());
  ASSERT_TRUE(none.has_value());
  EXPECT_EQ(none->numel(), 2);
  EXPECT_EQ(first->seen.back(), "w:-1");
}

TEST(Strategies, TheStrategyWhoseAxisAnEntryIsWholeAlongAlreadyIsPassedOver) {
  auto gathered = std::make_shared<Fake>(CheckpointWriting::parts, 1.0f);
  auto other = std::make_shared<Fake>(CheckpointWriting::whole, 2.0f);
  const Strategies strategies = of({gathered, other});
  const std::optional<Tensor> w = make_whole(strategies, "w", Tensor::zeros(Shape{3}), /*done=*/gathered.get());
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(w->numel(), 4);
  EXPECT_EQ(w->data<float>()[3], 2);
  EXPECT_TRUE(gathered->seen.empty());

  // Where no strategy changes it: nullopt (the entry is whole as the rank holds it).
  auto idle = std::make_shared<Fake>(CheckpointWriting::copy, 0.0f);
  EXPECT_FALSE(make_whole(of({idle}), "w", Tensor::zeros(Shape{3})).has_value());
}

}  // namespace
}  // namespace loom::training
