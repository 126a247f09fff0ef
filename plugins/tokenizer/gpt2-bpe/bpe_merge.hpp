// BPE on one piece: OpenAI encoder.py's bpe(), in O(n log n).
//
// encoder.py repeats: find the adjacent pair with the lowest merge rank, merge every occurrence of
// it scanning left to right (so "a a a" becomes "aa a"), until no pair has a rank. Done literally
// that costs a scan of the word per merge, O(n^2) on a long piece (a line of DNA, a base64 blob).
// Here the pairs wait in a heap ordered by (rank, position) and a merged pair's neighbours are
// looked up once. The pairs a merge creates are held back until every occurrence of the current
// pair is merged, as encoder.py's passes do, so the result is the same for any merge table, even
// one where a merged token takes part in a lower-ranked merge.
#pragma once

#include <cstdint>
#include <vector>

#include "bpe_model.hpp"

namespace loom::gpt2_bpe {

// Buffers reused from piece to piece within one encode call.
struct MergeScratch {
  struct Node {
    std::int32_t id;    // -1 once merged into its left neighbour
    std::int32_t next;  // index of the next live node, -1 at the end
    std::int32_t prev;
  };
  struct Candidate {
    std::uint32_t rank;
    std::int32_t left;  // node index; nodes keep their order, so this orders occurrences
    std::int32_t left_id, right_id, merged_id;
  };
  std::vector<Node> nodes;
  std::vector<Candidate> heap, pending;
};

// Replaces `symbols` (token ids, initially one per byte) by their BPE merge.
void bpe_merge(const MergeTable& merges, std::vector<std::int32_t>& symbols, MergeScratch& scratch);

}  // namespace loom::gpt2_bpe
