// A model's parallel plan: how each of its parameters is laid out along the `tensor` axis of the
// mesh (tensor parallelism, Shoeybi et al. 2019; torchtitan's `parallelize` plans, MaxText's
// logical axis rules). Header-only: models, the run layer and tools share the index arithmetic.
//
// A parameter is either
//   * replicated: every member of the tensor group holds all of it (norms, a router, gpt2's
//     position table). Its gradient is the same on every member, because what feeds it is;
//   * replicated_partial: every member holds all of it but computes only a part of its gradient
//     (Qwen 3's q/k norms see only the member's heads; key/value heads shared by several members);
//     the run layer sums those gradients over the tensor group before the optimizer step;
//   * split: dimension `dim` of the whole tensor is cut into `parts` (consecutive ranges along
//     dim, e.g. the q, k and v rows of a fused projection; one part when empty), and each part is
//     split evenly among the T members: member r holds rows [size * r / T, size * (r + 1) / T) of
//     every part, and its shard is those ranges concatenated, in part order. Column-parallel
//     (the output features), row-parallel (the input features), vocabulary-parallel (the
//     embedding's and the output layer's rows) and expert-parallel (whole experts) are all this
//     rule with a different dim and parts; `style` names which, for messages and the log.
//
// The model allocates only its member's shard of each split parameter (ModelSetup::tensor_rank,
// tensor_size) and initialises it with the values of the same elements of the one-process
// initialisation (global_index below); checkpoints and export hold whole tensors, assembled from
// the shards by the run layer, so any mesh resumes any other.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "loom/tensor.hpp"

namespace loom {

class Parameter;

enum class TensorSplit : std::uint8_t { replicated, replicated_partial, split };

struct TensorPlacement {
  TensorSplit split = TensorSplit::replicated;
  int dim = 0;                      // split only: the dimension cut
  std::vector<std::int64_t> parts;  // split only: the parts' extents along dim (sum = the whole extent); empty: one
  std::string style;                // "column", "row", "vocab", "experts", ... (split only)

  static TensorPlacement replicated() { return {}; }
  static TensorPlacement replicated_partial() { return {TensorSplit::replicated_partial, 0, {}, {}}; }
  static TensorPlacement split_along(int dim, std::string style, std::vector<std::int64_t> parts = {}) {
    return {TensorSplit::split, dim, std::move(parts), std::move(style)};
  }
  bool is_split() const { return split == TensorSplit::split; }
};

// One parameter of the plan: the model's parameter (its local shard) and its whole shape.
struct PlannedParameter {
  Parameter* parameter = nullptr;
  Shape whole;
  TensorPlacement placement;
};

namespace tensor_plan {

// [begin, end) of member `rank` of `size` in an extent of `extent`: the even split.
inline std::int64_t split_begin(std::int64_t extent, int rank, int size) {
  return extent * rank / size;
}

// The parts of a split placement for a whole extent (one part covering it when none are given).
inline std::vector<std::int64_t> parts_of(const TensorPlacement& p, std::int64_t extent) {
  if (p.parts.empty()) return {extent};
  std::int64_t sum = 0;
  for (const std::int64_t part : p.parts) sum += part;
  if (sum != extent)
    throw InternalError("parallel plan: parts summing to " + std::to_string(sum) + " for an extent of " +
                        std::to_string(extent));
  return p.parts;
}

// The shape of member `rank`'s shard of a parameter whose whole shape is `whole`.
inline Shape shard_shape(const Shape& whole, const TensorPlacement& p, int rank, int size) {
  if (!p.is_split() || size == 1) return whole;
  if (p.dim < 0 || p.dim >= whole.rank())
    throw InternalError("parallel plan: dim " + std::to_string(p.dim) + " of a " + whole.str() + " parameter");
  Shape out = whole;
  std::int64_t extent = 0;
  for (const std::int64_t part : parts_of(p, whole[p.dim]))
    extent += split_begin(part, rank + 1, size) - split_begin(part, rank, size);
  out[p.dim] = extent;
  return out;
}

// The runs of consecutive elements member `rank` holds, in the order of its shard (row-major):
// calls fn(whole_offset, shard_offset, count) for each. Both offsets are in elements of the
// contiguous whole tensor and of the contiguous shard. A replicated parameter is one run.
inline void for_each_run(const Shape& whole, const TensorPlacement& p, int rank, int size,
                         const std::function<void(std::int64_t, std::int64_t, std::int64_t)>& fn) {
  if (!p.is_split() || size == 1) {
    fn(0, 0, whole.numel());
    return;
  }
  // whole = [outer, extent, inner] around dim.
  std::int64_t outer = 1, inner = 1;
  for (int i = 0; i < p.dim; ++i) outer *= whole[i];
  for (int i = p.dim + 1; i < whole.rank(); ++i) inner *= whole[i];
  const std::int64_t extent = whole[p.dim];
  const std::vector<std::int64_t> parts = parts_of(p, extent);
  const std::int64_t local_extent = shard_shape(whole, p, rank, size)[p.dim];
  for (std::int64_t o = 0; o < outer; ++o) {
    std::int64_t part_begin = 0, local = 0;
    for (const std::int64_t part : parts) {
      const std::int64_t b = split_begin(part, rank, size), e = split_begin(part, rank + 1, size);
      if (e > b) fn((o * extent + part_begin + b) * inner, (o * local_extent + local) * inner, (e - b) * inner);
      local += e - b;
      part_begin += part;
    }
  }
}

// The index in the whole tensor of each element of member `rank`'s shard, in shard order: what
// a model's initialisation draws for its shard (random_normal(key, global_index)) so that the
// shards hold the one-process values.
inline std::vector<std::int64_t> global_indices(const Shape& whole, const TensorPlacement& p, int rank, int size) {
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(shard_shape(whole, p, rank, size).numel()));
  for_each_run(whole, p, rank, size, [&](std::int64_t w, std::int64_t, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) out.push_back(w + i);
  });
  return out;
}

// Copies member `rank`'s shard out of a whole contiguous f32 tensor, or back into one.
inline void extract_shard(const float* whole_data, const Shape& whole, const TensorPlacement& p, int rank, int size,
                          float* shard) {
  for_each_run(whole, p, rank, size,
               [&](std::int64_t w, std::int64_t s, std::int64_t n) { std::copy_n(whole_data + w, n, shard + s); });
}
inline void insert_shard(const float* shard, const Shape& whole, const TensorPlacement& p, int rank, int size,
                         float* whole_data) {
  for_each_run(whole, p, rank, size,
               [&](std::int64_t w, std::int64_t s, std::int64_t n) { std::copy_n(shard + s, n, whole_data + w); });
}

}  // namespace tensor_plan
}  // namespace loom
