#include "bpe_merge.hpp"

#include <algorithm>

namespace loom::gpt2_bpe {

namespace {

// std::push_heap/pop_heap build a max-heap; this ordering puts the lowest rank, then the leftmost
// occurrence, on top.
bool after(const MergeScratch::Candidate& a, const MergeScratch::Candidate& b) {
  return a.rank != b.rank ? a.rank > b.rank : a.left > b.left;
}

void consider(const MergeTable& merges, std::int32_t left, std::int32_t left_id, std::int32_t right_id,
              std::vector<MergeScratch::Candidate>& out) {
  const std::uint64_t v = merges.find(left_id, right_id);
  if (v == MergeTable::kNone) return;
  out.push_back(
      {static_cast<std::uint32_t>(v >> 32), left, left_id, right_id, static_cast<std::int32_t>(v & 0xFFFFFFFFu)});
}

}  // namespace

void bpe_merge(const MergeTable& merges, std::vector<std::int32_t>& symbols, MergeScratch& scratch) {
  const auto n = static_cast<std::int32_t>(symbols.size());
  if (n < 2) return;
  auto& nodes = scratch.nodes;
  auto& heap = scratch.heap;
  auto& pending = scratch.pending;
  nodes.resize(symbols.size());
  heap.clear();
  for (std::int32_t i = 0; i < n; ++i) {
    nodes[i] = {symbols[i], i + 1 < n ? i + 1 : -1, i - 1};
    if (i + 1 < n) consider(merges, i, symbols[i], symbols[i + 1], heap);
  }
  std::make_heap(heap.begin(), heap.end(), after);

  while (!heap.empty()) {
    // One pass of encoder.py: every occurrence of the lowest-ranked pair, left to right.
    const std::uint32_t rank = heap.front().rank;
    pending.clear();
    while (!heap.empty() && heap.front().rank == rank) {
      std::pop_heap(heap.begin(), heap.end(), after);
      const MergeScratch::Candidate c = heap.back();
      heap.pop_back();
      // Stale when either side has merged since: a merged node's id is a longer token, so an id
      // that still matches means the node is unchanged.
      MergeScratch::Node& left = nodes[c.left];
      if (left.id != c.left_id || left.next < 0 || nodes[left.next].id != c.right_id) continue;
      const std::int32_t right = left.next;
      left.id = c.merged_id;
      left.next = nodes[right].next;
      if (left.next >= 0) nodes[left.next].prev = c.left;
      nodes[right].id = -1;
      if (left.prev >= 0) consider(merges, left.prev, nodes[left.prev].id, left.id, pending);
      if (left.next >= 0) consider(merges, c.left, left.id, nodes[left.next].id, pending);
    }
    for (const auto& c : pending) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), after);
    }
  }

  std::size_t out = 0;
  for (std::int32_t i = 0; i >= 0; i = nodes[i].next) symbols[out++] = nodes[i].id;
  symbols.resize(out);
}

}  // namespace loom::gpt2_bpe
