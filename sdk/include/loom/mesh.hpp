// The device mesh: how the ranks of a run are laid out along named parallelism axes
// (MaxText's ici_*_parallelism, Levanter's mesh axes, trainer.mesh in a config).
//
// Axes, outermost first:
//   data  ranks that hold the same weights (replicas) and train on different rows of each batch;
//   fsdp    ranks that each own 1/F of every parameter (fully sharded data parallelism; they train
//           on different rows too);
//   tensor  ranks that split each layer's matrices between them (tensor parallelism, Megatron-LM)
//           and run the same rows: every operation's activations are exchanged, so it is innermost.
//
// Ranks are numbered data-major, the last axis varying fastest: with data D, fsdp F and tensor T,
// rank r has coordinates (r / (F T), (r / T) % F, r % T), so the ranks of one tensor group are
// neighbours, and those of one fsdp group next: on a multi-node job with consecutive ranks per
// node, the axes that move the most bytes stay within a node as long as their sizes divide the
// ranks per node.
//
// A group along an axis is the set of ranks whose coordinates on every other axis are equal; its
// members are ordered by their coordinate on the axis (which is their rank in the group).
// Collective::group() makes the communicator of one (sdk/include/loom/kinds/collective.hpp).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

enum class MeshAxis : int { data = 0, fsdp = 1, tensor = 2 };
inline constexpr int mesh_axis_count = 3;
inline constexpr std::array<MeshAxis, mesh_axis_count> mesh_axes{MeshAxis::data, MeshAxis::fsdp, MeshAxis::tensor};

// "data", "fsdp", "tensor": the axis's key in trainer.mesh.
std::string_view mesh_axis_name(MeshAxis axis);

class Mesh {
 public:
  using Sizes = std::array<int, mesh_axis_count>;  // indexed by MeshAxis

  // One process: every axis of size 1.
  Mesh();
  // Every size >= 1 (an InternalError otherwise).
  explicit Mesh(const Sizes& sizes);

  // The mesh a config asks for on `world_size` ranks: each size positive, or -1 on at most one
  // axis for "the ranks the others leave". A UserError naming `where` (the config key) when a
  // size is 0 or below -1, when two are -1, or when the sizes do not multiply to world_size.
  static Mesh resolve(const Sizes& requested, int world_size, std::string_view where = "trainer.mesh");

  int size(MeshAxis axis) const { return sizes_[static_cast<std::size_t>(axis)]; }
  const Sizes& sizes() const { return sizes_; }
  int world_size() const;

  // `rank`'s coordinate on each axis, and back. Both throw an InternalError out of range.
  Sizes coordinates(int rank) const;
  int coordinate(int rank, MeshAxis axis) const { return coordinates(rank)[static_cast<std::size_t>(axis)]; }
  int rank_of(const Sizes& coordinates) const;

  // The group along `axis` through `rank`: the world ranks of its members in group order (rank
  // sits at index coordinate(rank, axis)).
  std::vector<int> group_ranks(int rank, MeshAxis axis) const;
  // Which of the world_size() / size(axis) groups along `axis` holds `rank`, numbered in rank
  // order of their first members (the same on every member: the colour of a split).
  int group_index(int rank, MeshAxis axis) const;

  // "data 2 x fsdp 1 x tensor 1": every axis with its size, outermost first.
  std::string describe() const;

  bool operator==(const Mesh&) const = default;

 private:
  Sizes sizes_;
};

}  // namespace loom
