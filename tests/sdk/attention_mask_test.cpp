// loom::AttentionMask (sdk/include/loom/attention_mask.hpp): the contract's visibility rule,
// per score, per row and per tile, against the rule as kinds/attention.hpp writes it.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <loom/attention_mask.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

using std::int64_t;

// The "visible" rule of kinds/attention.hpp, transcribed.
bool rule(const loom::AttentionForwardArgs& a, int64_t b, int64_t i, int64_t j) {
  const int64_t p = a.kv_len - a.q_len + i;
  bool seen = true;
  if (a.params.causal) seen = seen && j <= p;
  if (a.params.window > 0) seen = seen && p - j < a.params.window && (a.params.causal || j - p < a.params.window);
  if (a.q_segments) seen = seen && a.q_segments[b * a.q_len + i] == a.kv_segments[b * a.kv_len + j];
  return seen;
}

struct Shape {
  int64_t q_len, kv_len, window;
  bool causal, segments;
};

class AttentionMaskTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AttentionMaskTest, EveryGranularityFollowsTheRule) {
  const Shape s = GetParam();
  constexpr int64_t batch = 2;
  std::mt19937 rng(static_cast<unsigned>(s.q_len * 131 + s.kv_len * 7 + s.window));
  std::vector<std::int32_t> q_seg(static_cast<size_t>(batch * s.q_len)), kv_seg(static_cast<size_t>(batch * s.kv_len));
  for (int64_t b = 0; b < batch; ++b) {  // packed documents; the queries are the keys' suffix
    std::int32_t id = 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      if (j > 0 && rng() % 4 == 0) ++id;
      kv_seg[static_cast<size_t>(b * s.kv_len + j)] = id;
    }
    for (int64_t i = 0; i < s.q_len; ++i)
      q_seg[static_cast<size_t>(b * s.q_len + i)] =
          rng() % 5 == 0 ? 99 : kv_seg[static_cast<size_t>(b * s.kv_len + s.kv_len - s.q_len + i)];
  }
  loom::AttentionForwardArgs a;
  a.batch = batch;
  a.q_len = s.q_len;
  a.kv_len = s.kv_len;
  a.params.causal = s.causal;
  a.params.window = s.window;
  if (s.segments) {
    a.q_segments = q_seg.data();
    a.kv_segments = kv_seg.data();
  }
  const loom::AttentionMask mask(a);
  int64_t seen = 0, hidden = 0;
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < s.q_len; ++i) {
      // One score at a time.
      for (int64_t j = 0; j < s.kv_len; ++j) {
        ASSERT_EQ(mask.visible(b, i, j), rule(a, b, i, j)) << "b " << b << ", i " << i << ", j " << j;
        (rule(a, b, i, j) ? seen : hidden) += 1;
      }
      // A row, in pieces of every width from every start.
      for (int64_t j0 = 0; j0 < s.kv_len; ++j0)
        for (int64_t cols = 1; j0 + cols <= s.kv_len; cols += 3) {
          std::vector<float> row(static_cast<size_t>(cols), 1.0f);
          mask.apply(b, i, j0, cols, row.data(), -5.0f);
          for (int64_t c = 0; c < cols; ++c)
            ASSERT_EQ(row[static_cast<size_t>(c)], rule(a, b, i, j0 + c) ? 1.0f : -5.0f)
                << "row " << i << ", keys from " << j0 << ", column " << c;
        }
    }
    // Tiles: `none` hides every score, `full` shows every score.
    for (int64_t bq : {1, 2, 3, 5})
      for (int64_t bk : {1, 2, 4, 7})
        for (int64_t i0 = 0; i0 < s.q_len; i0 += bq)
          for (int64_t j0 = 0; j0 < s.kv_len; j0 += bk) {
            const int64_t i1 = std::min(i0 + bq, s.q_len), j1 = std::min(j0 + bk, s.kv_len);
            bool any = false, all = true;
            for (int64_t i = i0; i < i1; ++i)
              for (int64_t j = j0; j < j1; ++j) {
                any = any || rule(a, b, i, j);
                all = all && rule(a, b, i, j);
              }
            const loom::MaskCover cover = mask.cover(b, i0, i1, j0, j1);
            if (cover == loom::MaskCover::none) {
              ASSERT_FALSE(any) << "a tile with a visible score was called hidden: rows [" << i0 << ", " << i1
                                << "), keys [" << j0 << ", " << j1 << ")";
            }
            if (cover == loom::MaskCover::full) {
              ASSERT_TRUE(all) << "a tile with a hidden score was called full: rows [" << i0 << ", " << i1
                               << "), keys [" << j0 << ", " << j1 << ")";
            }
            // Without segment ids, the positional tests are exact.
            if (!s.segments) {
              if (!any) {
                EXPECT_EQ(cover, loom::MaskCover::none);
              }
              if (all) {
                EXPECT_EQ(cover, loom::MaskCover::full);
              }
            }
          }
  }
  if (s.causal || s.window > 0 || s.segments) {
    EXPECT_GT(hidden, 0) << "the case masks nothing";
  }
  EXPECT_GT(seen, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttentionMaskTest,
                         ::testing::Values(Shape{9, 9, 0, true, false}, Shape{9, 9, 0, false, false},
                                           Shape{4, 13, 0, true, false}, Shape{11, 11, 3, true, false},
                                           Shape{11, 11, 3, false, false}, Shape{5, 12, 4, true, false},
                                           Shape{12, 12, 0, true, true}, Shape{12, 12, 0, false, true},
                                           Shape{7, 16, 5, true, true}, Shape{10, 10, 2, false, true},
                                           Shape{1, 1, 0, false, false}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           const Shape& s = info.param;
                           return "q" + std::to_string(s.q_len) + "_kv" + std::to_string(s.kv_len) + "_window" +
                                  std::to_string(s.window) + (s.causal ? "_causal" : "_bidirectional") +
                                  (s.segments ? "_segments" : "");
                         });

}  // namespace
