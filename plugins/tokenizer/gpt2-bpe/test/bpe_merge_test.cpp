// bpe_merge against a line-by-line transliteration of encoder.py's bpe() loop, on random merge
// tables (including ones where a merged token takes part in a lower-ranked merge, which trained
// merge lists never have) and random words over a small alphabet, so that pairs repeat and overlap.
#include "../bpe_merge.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "../bpe_model.hpp"

namespace {

using loom::gpt2_bpe::MergeTable;
using Ids = std::vector<std::int32_t>;
using Ranks =
    std::map<std::pair<std::int32_t, std::int32_t>, std::pair<std::int32_t, std::int32_t>>;  // -> rank, merged

// encoder.py's Encoder.bpe, with ids for strings.
Ids reference_bpe(const Ranks& ranks, Ids word) {
  while (word.size() > 1) {
    std::int32_t best = std::numeric_limits<std::int32_t>::max();
    std::pair<std::int32_t, std::int32_t> bigram;
    for (std::size_t i = 0; i + 1 < word.size(); ++i) {
      const auto it = ranks.find({word[i], word[i + 1]});
      if (it != ranks.end() && it->second.first < best) best = it->second.first, bigram = it->first;
    }
    if (best == std::numeric_limits<std::int32_t>::max()) break;
    const auto [first, second] = bigram;
    Ids new_word;
    std::size_t i = 0;
    while (i < word.size()) {
      const auto j = std::find(word.begin() + static_cast<std::ptrdiff_t>(i), word.end(), first) - word.begin();
      new_word.insert(new_word.end(), word.begin() + static_cast<std::ptrdiff_t>(i), word.begin() + j);
      i = static_cast<std::size_t>(j);
      if (i == word.size()) break;
      if (word[i] == first && i + 1 < word.size() && word[i + 1] == second) {
        new_word.push_back(ranks.at(bigram).second);
        i += 2;
      } else {
        new_word.push_back(word[i]);
        i += 1;
      }
    }
    word = new_word;
  }
  return word;
}

TEST(BpeMerge, MatchesEncoderPyOnRandomTablesAndWords) {
  std::mt19937 rng(42);
  loom::gpt2_bpe::MergeScratch scratch;
  for (int table = 0; table < 200; ++table) {
    const int alphabet = 2 + table % 4;
    // Merges over ids that exist so far; each makes a new id. Every other table is shuffled, so
    // ranks no longer follow creation order.
    std::vector<MergeTable::Merge> merges;
    std::int32_t next_id = alphabet;
    const int count = 1 + static_cast<int>(rng() % 40);
    for (int m = 0; m < count; ++m) {
      std::uniform_int_distribution<std::int32_t> pick(0, next_id - 1);
      merges.push_back({pick(rng), pick(rng), next_id++});
    }
    if (table % 2) std::shuffle(merges.begin(), merges.end(), rng);
    MergeTable merge_table;
    merge_table.build(merges);
    Ranks ranks;
    for (std::size_t r = 0; r < merges.size(); ++r)  // later duplicates win, as in dict(zip(...))
      ranks[{merges[r].left, merges[r].right}] = {static_cast<std::int32_t>(r), merges[r].merged};

    for (int word = 0; word < 100; ++word) {
      Ids symbols(rng() % 60);
      for (auto& s : symbols) s = static_cast<std::int32_t>(rng() % static_cast<unsigned>(alphabet));
      const Ids expected = reference_bpe(ranks, symbols);
      Ids got = symbols;
      loom::gpt2_bpe::bpe_merge(merge_table, got, scratch);
      ASSERT_EQ(got, expected) << "table " << table << ", word " << word;
    }
  }
}

TEST(BpeMerge, MergesEveryOccurrenceLeftToRightBeforeTheNextRank) {
  // 0 0 -> 2 (rank 0); 2 0 -> 3 (rank 1); 0 2 -> 4 (rank 2)
  MergeTable table;
  table.build({{0, 0, 2}, {2, 0, 3}, {0, 2, 4}});
  loom::gpt2_bpe::MergeScratch scratch;
  Ids word{0, 0, 0};  // "a a a" -> "aa a" -> "aaa" (via 2 0), never "a aa"
  loom::gpt2_bpe::bpe_merge(table, word, scratch);
  EXPECT_EQ(word, (Ids{3}));
  Ids four{0, 0, 0, 0};  // -> "aa aa": both occurrences in one pass
  loom::gpt2_bpe::bpe_merge(table, four, scratch);
  EXPECT_EQ(four, (Ids{2, 2}));
}

TEST(BpeMerge, LongPiecesStayFast) {
  // 200,000 symbols where every merge applies once: quadratic rescanning would take minutes.
  std::vector<MergeTable::Merge> merges;
  const std::int32_t n = 200000;
  // Symbols 0..n-1 all distinct; merge (i, i+1) -> n+i for even i, ranks in descending position
  // so that each pass merges a single occurrence.
  for (std::int32_t i = n - 2; i >= 0; i -= 2) merges.push_back({i, i + 1, n + i});
  MergeTable table;
  table.build(merges);
  Ids word(static_cast<std::size_t>(n));
  for (std::int32_t i = 0; i < n; ++i) word[static_cast<std::size_t>(i)] = i;
  loom::gpt2_bpe::MergeScratch scratch;
  loom::gpt2_bpe::bpe_merge(table, word, scratch);
  ASSERT_EQ(word.size(), static_cast<std::size_t>(n / 2));
  EXPECT_EQ(word.front(), n);
  EXPECT_EQ(word.back(), n + n - 2);
}

}  // namespace
