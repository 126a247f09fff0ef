#include "loom/mesh.hpp"

#include <string>

#include "loom/error.hpp"

namespace loom {

std::string_view mesh_axis_name(MeshAxis axis) {
  switch (axis) {
    case MeshAxis::data:
      return "data";
    case MeshAxis::fsdp:
      return "fsdp";
    case MeshAxis::tensor:
      return "tensor";
  }
  return "?";
}

Mesh::Mesh() {
  sizes_.fill(1);
}

Mesh::Mesh(const Sizes& sizes) : sizes_(sizes) {
  for (MeshAxis axis : mesh_axes)
    if (size(axis) < 1)
      throw InternalError("mesh: axis " + std::string(mesh_axis_name(axis)) + " of size " + std::to_string(size(axis)) +
                          " (" + describe() + ")");
}

Mesh Mesh::resolve(const Sizes& requested, int world_size, std::string_view where) {
  const std::string key(where);
  // "{data: -1, fsdp: 2}", as the user would write it back.
  std::string written = "{";
  for (MeshAxis axis : mesh_axes)
    written += (axis == mesh_axes.front() ? "" : ", ") + std::string(mesh_axis_name(axis)) + ": " +
               std::to_string(requested[static_cast<std::size_t>(axis)]);
  written += "}";
  const std::string ranks = std::to_string(world_size) + (world_size == 1 ? " rank" : " ranks");
  int free_axis = -1;
  long long product = 1;
  for (MeshAxis axis : mesh_axes) {
    const int n = requested[static_cast<std::size_t>(axis)];
    const std::string name = key + "." + std::string(mesh_axis_name(axis));
    if (n == -1) {
      if (free_axis >= 0)
        throw UserError(key + " " + written + ": only one axis may be -1 (\"the remaining ranks\"); give " +
                        std::string(mesh_axis_name(static_cast<MeshAxis>(free_axis))) + " or " +
                        std::string(mesh_axis_name(axis)) + " a size");
      free_axis = static_cast<int>(axis);
    } else if (n < 1) {
      throw UserError(name + " is " + std::to_string(n) +
                      ": each axis of the mesh is a number of ranks, at least 1, or -1 for the ranks the other axes "
                      "leave");
    } else {
      product *= n;
    }
  }
  Sizes sizes = requested;
  if (free_axis >= 0) {
    if (world_size % product != 0)
      throw UserError(key + " " + written + " does not divide the " + ranks + " of this run: the axes other than " +
                      std::string(mesh_axis_name(static_cast<MeshAxis>(free_axis))) + " take " +
                      std::to_string(product) + " ranks, which " + std::to_string(world_size) +
                      " is not a multiple of (start as many ranks as a multiple of " + std::to_string(product) +
                      ", or change the mesh)");
    sizes[static_cast<std::size_t>(free_axis)] = static_cast<int>(world_size / product);
  } else if (product != world_size) {
    throw UserError(key + " " + written + " has " + std::to_string(product) + " ranks but the run has " + ranks +
                    ": the sizes of the axes must multiply to the number of ranks (mpirun -np), or one may be -1 "
                    "for the ranks the others leave");
  }
  return Mesh(sizes);
}

int Mesh::world_size() const {
  int n = 1;
  for (int s : sizes_) n *= s;
  return n;
}

Mesh::Sizes Mesh::coordinates(int rank) const {
  if (rank < 0 || rank >= world_size())
    throw InternalError("mesh: rank " + std::to_string(rank) + " outside " + describe());
  Sizes c{};
  // The last axis varies fastest.
  for (int a = mesh_axis_count - 1; a >= 0; --a) {
    c[static_cast<std::size_t>(a)] = rank % sizes_[static_cast<std::size_t>(a)];
    rank /= sizes_[static_cast<std::size_t>(a)];
  }
  return c;
}

int Mesh::rank_of(const Sizes& coordinates) const {
  int rank = 0;
  for (std::size_t a = 0; a < sizes_.size(); ++a) {
    if (coordinates[a] < 0 || coordinates[a] >= sizes_[a])
      throw InternalError("mesh: coordinate " + std::to_string(coordinates[a]) + " on axis " +
                          std::string(mesh_axis_name(static_cast<MeshAxis>(a))) + " outside " + describe());
    rank = rank * sizes_[a] + coordinates[a];
  }
  return rank;
}

std::vector<int> Mesh::group_ranks(int rank, MeshAxis axis) const {
  Sizes c = coordinates(rank);
  std::vector<int> ranks;
  for (int i = 0; i < size(axis); ++i) {
    c[static_cast<std::size_t>(axis)] = i;
    ranks.push_back(rank_of(c));
  }
  return ranks;
}

int Mesh::group_index(int rank, MeshAxis axis) const {
  const Sizes c = coordinates(rank);
  // The other axes' coordinates as a number, outermost first: the groups' order by first member.
  int index = 0;
  for (std::size_t a = 0; a < sizes_.size(); ++a)
    if (static_cast<MeshAxis>(a) != axis) index = index * sizes_[a] + c[a];
  return index;
}

std::string Mesh::describe() const {
  std::string text;
  for (MeshAxis axis : mesh_axes)
    text += (text.empty() ? "" : " x ") + std::string(mesh_axis_name(axis)) + " " + std::to_string(size(axis));
  return text;
}

}  // namespace loom
