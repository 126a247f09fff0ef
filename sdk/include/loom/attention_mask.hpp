// The attention mask rule of kinds/attention.hpp, written once for every attention kernel.
//
// Query row i of a call is at position p_i = kv_len - q_len + i, and sees key j when
//   causal:          j <= p_i
//   window > 0:      p_i - j < window          (and j - p_i < window if not causal)
//   segments given:  q_segments[b, i] == kv_segments[b, j]
// A kernel asks at the granularity it computes at:
//   * one score:        mask.visible(b, i, j)                   (a readable kernel)
//   * one row of keys:  mask.apply(b, i, j0, cols, row, -inf)   (hides what row i may not see)
//   * one tile:         mask.cover(b, i0, i1, j0, j1)           (skip hidden tiles, mask only
//                                                                the partial ones)
//
//   const loom::AttentionMask mask(args);
//   for each tile:
//     const loom::MaskCover cover = mask.cover(b, i0, i1, j0, j1);
//     if (cover == loom::MaskCover::none) continue;
//     ... scores of the tile ...
//     if (cover == loom::MaskCover::partial)
//       for (r ...) mask.apply(b, i0 + r, j0, j1 - j0, scores + r * ld, -infinity);
//
// The mask holds pointers into the call's segment ids: valid while the call's arguments are.
// Every method is const and may be called from any thread.
#pragma once

#include <algorithm>
#include <cstdint>

#include "loom/kinds/attention.hpp"

namespace loom {

// How much of a tile of scores the mask leaves visible.
enum class MaskCover { none, partial, full };

class AttentionMask {
 public:
  explicit AttentionMask(const AttentionForwardArgs& a)
      : offset_(a.kv_len - a.q_len),
        window_(a.params.window),
        causal_(a.params.causal),
        q_len_(a.q_len),
        kv_len_(a.kv_len),
        q_segments_(a.q_segments),
        kv_segments_(a.kv_segments) {}

  // Whether query row i of batch b may see key j.
  bool visible(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const std::int64_t position = offset_ + i;
    if (causal_ && j > position) return false;
    if (window_ > 0) {
      if (position - j >= window_) return false;
      if (!causal_ && j - position >= window_) return false;
    }
    return q_segments_ == nullptr || q_segments_[b * q_len_ + i] == kv_segments_[b * kv_len_ + j];
  }

  // Rows [i0, i1) against keys [j0, j1) of batch b (both ranges non-empty): none when no row
  // sees any key, full when every row sees every key, partial otherwise (or when it is cheaper
  // not to tell: a partial tile is masked row by row, which is exact either way).
  MaskCover cover(std::int64_t b, std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1) const {
    const std::int64_t first = offset_ + i0, last = offset_ + i1 - 1;  // positions of the rows
    bool full = true;
    if (causal_) {
      if (j0 > last) return MaskCover::none;
      if (j1 - 1 > first) full = false;
    }
    if (window_ > 0) {
      if (j1 - 1 <= first - window_) return MaskCover::none;  // every key too old for every row
      if (j0 <= last - window_) full = false;
      if (!causal_) {
        if (j0 >= last + window_) return MaskCover::none;
        if (j1 - 1 >= first + window_) full = false;
      }
    }
    if (q_segments_ != nullptr) {
      // Ids only ever match inside the intersection of the two ranges of ids.
      const auto [q_lo, q_hi] = std::minmax_element(q_segments_ + b * q_len_ + i0, q_segments_ + b * q_len_ + i1);
      const auto [k_lo, k_hi] = std::minmax_element(kv_segments_ + b * kv_len_ + j0, kv_segments_ + b * kv_len_ + j1);
      if (*q_hi < *k_lo || *k_hi < *q_lo) return MaskCover::none;
      if (!(*q_lo == *q_hi && *k_lo == *k_hi && *q_lo == *k_lo)) full = false;
    }
    return full ? MaskCover::full : MaskCover::partial;
  }

  // The columns [lo, hi) of keys j0 + [0, cols) that row i may see by position (segment ids
  // aside): the keys outside are hidden from row i whatever the ids.
  struct Columns {
    std::int64_t lo, hi;
  };
  Columns columns(std::int64_t i, std::int64_t j0, std::int64_t cols) const {
    const std::int64_t position = offset_ + i;
    std::int64_t lo = 0, hi = cols;
    if (causal_) hi = std::min(hi, position - j0 + 1);
    if (window_ > 0) {
      lo = std::max(lo, position - window_ + 1 - j0);
      if (!causal_) hi = std::min(hi, position + window_ - j0);
    }
    lo = std::clamp<std::int64_t>(lo, 0, cols);
    return {lo, std::clamp<std::int64_t>(hi, lo, cols)};
  }

  // Sets row[c] to `hidden` for every key j0 + c (c in [0, cols)) that row i of batch b may not
  // see; leaves the others as they are.
  void apply(std::int64_t b, std::int64_t i, std::int64_t j0, std::int64_t cols, float* row, float hidden) const {
    const auto [lo, hi] = columns(i, j0, cols);
    std::fill(row, row + lo, hidden);
    std::fill(row + hi, row + cols, hidden);
    if (q_segments_ != nullptr) {
      const std::int32_t id = q_segments_[b * q_len_ + i];
      const std::int32_t* keys = kv_segments_ + b * kv_len_ + j0;
      for (std::int64_t c = lo; c < hi; ++c) row[c] = keys[c] == id ? row[c] : hidden;
    }
  }

 private:
  std::int64_t offset_, window_;
  bool causal_;
  std::int64_t q_len_, kv_len_;
  const std::int32_t* q_segments_;
  const std::int32_t* kv_segments_;
};

}  // namespace loom
