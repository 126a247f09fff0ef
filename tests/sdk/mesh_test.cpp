// loom::Mesh (sdk/include/loom/mesh.hpp): trainer.mesh resolved on a world size, the layout of the
// ranks (data-major, then fsdp, tensor innermost) and the groups along each axis.
#include "loom/mesh.hpp"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "loom/error.hpp"

namespace {

using loom::Mesh;
using loom::MeshAxis;

std::string user_error(const Mesh::Sizes& requested, int world_size) {
  try {
    Mesh::resolve(requested, world_size);
  } catch (const loom::UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Mesh, TheDefaultIsEveryRankAlongData) {
  const Mesh m = Mesh::resolve({-1, 1, 1}, 4);
  EXPECT_EQ(m.size(MeshAxis::data), 4);
  EXPECT_EQ(m.size(MeshAxis::fsdp), 1);
  EXPECT_EQ(m.describe(), "data 4 x fsdp 1 x tensor 1");
  EXPECT_EQ(m.size(MeshAxis::tensor), 1);
  EXPECT_EQ(Mesh::resolve({-1, 1, 1}, 1), Mesh());
}

TEST(Mesh, MinusOneTakesTheRanksTheOtherAxesLeave) {
  EXPECT_EQ(Mesh::resolve({2, -1, 1}, 8).describe(), "data 2 x fsdp 4 x tensor 1");
  EXPECT_EQ(Mesh::resolve({-1, 2, 1}, 8).describe(), "data 4 x fsdp 2 x tensor 1");
  EXPECT_EQ(Mesh::resolve({1, 2, 1}, 2).describe(), "data 1 x fsdp 2 x tensor 1");
  EXPECT_EQ(Mesh::resolve({-1, 1, 2}, 8).describe(), "data 4 x fsdp 1 x tensor 2");
  EXPECT_EQ(Mesh::resolve({1, 2, -1}, 8).describe(), "data 1 x fsdp 2 x tensor 4");
}

TEST(Mesh, AMeshThatDoesNotFitTheRanksIsOneClearUserError) {
  EXPECT_EQ(user_error({-1, 3, 1}, 4),
            "trainer.mesh {data: -1, fsdp: 3, tensor: 1} does not divide the 4 ranks of this run: the axes other than "
            "data take "
            "3 ranks, which 4 is not a multiple of (start as many ranks as a multiple of 3, or change the mesh)");
  EXPECT_EQ(user_error({2, 1, 2}, 2),
            "trainer.mesh {data: 2, fsdp: 1, tensor: 2} has 4 ranks but the run has 2 ranks: the sizes of the axes "
            "must multiply "
            "to the number of ranks (mpirun -np), or one may be -1 for the ranks the others leave");
  EXPECT_EQ(user_error({-1, -1, 1}, 4),
            "trainer.mesh {data: -1, fsdp: -1, tensor: 1}: only one axis may be -1 (\"the remaining ranks\"); give "
            "data or fsdp a "
            "size");
  EXPECT_EQ(user_error({0, 1, 1}, 1),
            "trainer.mesh.data is 0: each axis of the mesh is a number of ranks, at least 1, or -1 for the ranks the "
            "other axes leave");
  EXPECT_NE(user_error({1, -2, 1}, 1).find("trainer.mesh.fsdp is -2"), std::string::npos);
  EXPECT_NE(user_error({1, 1, 0}, 1).find("trainer.mesh.tensor is 0"), std::string::npos);
}

TEST(Mesh, RanksAreDataMajorWithTensorInnermost) {
  const Mesh m(Mesh::Sizes{2, 3, 2});
  EXPECT_EQ(m.world_size(), 12);
  // rank = (data * 3 + fsdp) * 2 + tensor
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(m.coordinate(r, MeshAxis::data), r / 6);
    EXPECT_EQ(m.coordinate(r, MeshAxis::fsdp), (r / 2) % 3);
    EXPECT_EQ(m.coordinate(r, MeshAxis::tensor), r % 2);
    EXPECT_EQ(m.rank_of(m.coordinates(r)), r);
  }
  EXPECT_THROW(m.coordinates(12), loom::InternalError);
  EXPECT_THROW(m.rank_of({2, 0, 0}), loom::InternalError);
  EXPECT_THROW(m.rank_of({0, 0, 2}), loom::InternalError);
  EXPECT_THROW(Mesh(Mesh::Sizes{0, 1, 1}), loom::InternalError);
}

TEST(Mesh, GroupsAlongAnAxisPartitionTheRanksInCoordinateOrder) {
  const Mesh m(Mesh::Sizes{2, 3, 2});
  // Tensor groups are neighbours; fsdp groups stride by the tensor size, data groups by fsdp x tensor.
  EXPECT_EQ(m.group_ranks(9, MeshAxis::tensor), (std::vector<int>{8, 9}));
  EXPECT_EQ(m.group_ranks(9, MeshAxis::fsdp), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(m.group_ranks(9, MeshAxis::data), (std::vector<int>{3, 9}));
  for (MeshAxis axis : loom::mesh_axes) {
    std::set<int> seen;
    std::set<int> indices;
    for (int r = 0; r < m.world_size(); ++r) {
      const auto members = m.group_ranks(r, axis);
      ASSERT_EQ(static_cast<int>(members.size()), m.size(axis));
      EXPECT_EQ(members[static_cast<std::size_t>(m.coordinate(r, axis))], r);
      // Every member agrees on the group's index (a split's colour); different groups differ.
      for (int member : members) EXPECT_EQ(m.group_index(member, axis), m.group_index(r, axis));
      indices.insert(m.group_index(r, axis));
      seen.insert(members.begin(), members.end());
    }
    EXPECT_EQ(static_cast<int>(seen.size()), m.world_size());
    EXPECT_EQ(static_cast<int>(indices.size()), m.world_size() / m.size(axis));
    EXPECT_EQ(*indices.begin(), 0);
    EXPECT_EQ(*indices.rbegin(), m.world_size() / m.size(axis) - 1);
  }
}

}  // namespace
