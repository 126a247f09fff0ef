// The one slicing of a batch into micro-batches that training and evaluation share.
#include "train/micro_batches.hpp"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace loom::training {
namespace {

// batch_size x seq_len tokens numbered 0, 1, 2, ...; the targets of the rows in `uncounted` are
// all -1.
Batch numbered_batch(std::int64_t batch_size, std::int64_t seq_len, const std::vector<std::int64_t>& uncounted,
                     bool segments) {
  Batch b;
  b.batch_size = batch_size;
  b.seq_len = seq_len;
  b.inputs.resize(static_cast<std::size_t>(batch_size * seq_len));
  std::iota(b.inputs.begin(), b.inputs.end(), 0);
  b.targets = b.inputs;
  for (auto row : uncounted)
    for (std::int64_t i = 0; i < seq_len; ++i) b.targets[static_cast<std::size_t>(row * seq_len + i)] = -1;
  if (segments) b.segment_ids.assign(b.inputs.size(), 7);
  return b;
}

struct Seen {
  std::int64_t index, rows, counted;
  std::vector<std::int32_t> tokens, targets;
  bool has_segments;
};

std::vector<Seen> slice(const Batch& batch, std::int64_t micro_size) {
  std::vector<Seen> seen;
  for_each_micro_batch(batch, micro_size, [&](const MicroBatch& m) {
    EXPECT_EQ(m.tokens.shape(), m.targets.shape());
    seen.push_back({m.index, m.tokens.shape()[0], m.counted, m.tokens.to_int_vector(), m.targets.to_int_vector(),
                    m.segments.defined()});
  });
  return seen;
}

TEST(MicroBatches, SliceRowsInOrderWithTheLastOneShorter) {
  const Batch batch = numbered_batch(5, 3, {}, false);
  const auto seen = slice(batch, 2);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].rows, 2);
  EXPECT_EQ(seen[2].rows, 1);
  EXPECT_EQ(seen[1].index, 1);
  EXPECT_EQ(seen[1].tokens, (std::vector<std::int32_t>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(seen[2].tokens, (std::vector<std::int32_t>{12, 13, 14}));
  EXPECT_EQ(seen[2].counted, 3);
  EXPECT_FALSE(seen[0].has_segments);
}

TEST(MicroBatches, SkipMicroBatchesWithoutCountedTargetsAndKeepTheirIndex) {
  Batch batch = numbered_batch(4, 2, {2, 3}, true);
  batch.targets[1] = -1;  // one uncounted target in the first micro-batch
  const auto seen = slice(batch, 2);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].index, 0);
  EXPECT_EQ(seen[0].counted, 3);
  EXPECT_EQ(seen[0].targets, (std::vector<std::int32_t>{0, -1, 2, 3}));
  EXPECT_TRUE(seen[0].has_segments);

  // Skipped in the middle: the next one is still index 2 (its dropout stream).
  const auto middle = slice(numbered_batch(3, 2, {1}, false), 1);
  ASSERT_EQ(middle.size(), 2u);
  EXPECT_EQ(middle[1].index, 2);
  EXPECT_EQ(count_targets(numbered_batch(3, 2, {1}, false).targets), 4);
}

TEST(MicroBatches, AWholeBatchIsOneMicroBatch) {
  const auto seen = slice(numbered_batch(4, 3, {}, false), 4);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].rows, 4);
  EXPECT_EQ(seen[0].counted, 12);
}

}  // namespace
}  // namespace loom::training
