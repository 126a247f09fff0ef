// The `collective` contract (sdk/include/loom/kinds/collective.hpp), on the world and on the
// groups along every axis of every mesh the world's ranks make, through the real plugin host.
//
// Which collective: LOOM_TEST_COLLECTIVE when set; under `loom conformance PLUGIN.so`, the
// plugin's; else `single`. Run as one process, or under `mpirun -np N` for a collective of many
// ranks (loom's build runs `mpi` with 2 and 4 ranks; a third party runs
// `mpirun -np 4 loom conformance libloom-collective-NAME.so`): every rank runs every test, with
// inputs that depend on its rank, and checks the exact result (the inputs are small integers and
// halves, so every sum is exact in float32). The determinism tests use inputs whose sums round,
// and require the same bits on every member, in every group of one size, and on every repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "conformance_setup.hpp"
#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/mesh.hpp"

namespace {

loom::Registry& registry() {
  static loom::Registry* r = [] {
    auto* reg = new loom::Registry;
    loom::PluginHost host;
    host.load(loom::conformance::plugins(), *reg);
    return reg;
  }();
  return *r;
}

std::string collective_name() {
  if (const char* name = std::getenv("LOOM_TEST_COLLECTIVE")) return name;
  const auto& subject = loom::conformance::setup().subject;
  for (const loom::ComponentEntry* entry : registry().list("collective"))
    if (!subject.empty() && entry->plugin_file == subject.string()) return entry->decl.name;
  return "single";
}

loom::Collective& collective() {
  static loom::Handle<loom::Collective> handle = [] {
    const std::string name = collective_name();
    return registry().create<loom::Collective>({"collective", name, loom::Value(name), "collective"});
  }();
  return *handle;
}

// Every mesh of the world's ranks: data x fsdp x tensor for each factorisation.
std::vector<loom::Mesh> meshes() {
  const int n = collective().size();
  std::vector<loom::Mesh> out;
  for (int data = n; data >= 1; --data)
    for (int fsdp = n / data; fsdp >= 1; --fsdp)
      if (n % (data * fsdp) == 0) out.emplace_back(loom::Mesh::Sizes{data, fsdp, n / (data * fsdp)});
  return out;
}

// A group along each axis of each mesh, with what the test expects of it.
struct AxisGroup {
  loom::Mesh mesh;
  loom::MeshAxis axis;
  std::shared_ptr<loom::CollectiveGroup> group;
  std::vector<int> members;  // world ranks, in group order
  std::string label;
};
std::vector<AxisGroup> axis_groups() {
  auto& c = collective();
  std::vector<AxisGroup> out;
  for (const loom::Mesh& mesh : meshes())
    for (loom::MeshAxis axis : loom::mesh_axes)
      out.push_back({mesh, axis, c.group(mesh, axis), mesh.group_ranks(c.rank(), axis),
                     "mesh " + mesh.describe() + ", group along " + std::string(loom::mesh_axis_name(axis)) +
                         " (world rank " + std::to_string(c.rank()) + ")"});
  return out;
}

// A value whose sums round in float32, that depends on the group rank `g` only (so every group of
// one size reduces the same inputs).
float rounding(int g, std::size_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.3 * g) *
                            std::pow(10.0, static_cast<double>(static_cast<int>(i % 9)) - 4.0));
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Every rank's `mine`, on every rank (over the world).
std::vector<std::vector<float>> from_every_rank(const std::vector<float>& mine) {
  auto& c = collective();
  std::vector<float> all(mine.size() * static_cast<std::size_t>(c.size()));
  c.all_gather(mine, all);
  std::vector<std::vector<float>> out;
  for (int r = 0; r < c.size(); ++r)
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(r * mine.size()),
                     all.begin() + static_cast<std::ptrdiff_t>((r + 1) * mine.size()));
  return out;
}

TEST(CollectiveConformance, RankAndSize) {
  auto& c = collective();
  EXPECT_GE(c.size(), 1);
  EXPECT_GE(c.rank(), 0);
  EXPECT_LT(c.rank(), c.size());
  if (collective_name() == "single") {
    EXPECT_EQ(c.size(), 1);
  }
  if (const char* n = std::getenv("OMPI_COMM_WORLD_SIZE"); n && collective_name() == "mpi") {
    EXPECT_EQ(c.size(), std::atoi(n));
  }
  EXPECT_FALSE(c.describe().empty());
}

TEST(CollectiveConformance, AllReduceSumsEveryRanksValuesWhateverTheLength) {
  auto& c = collective();
  const int n = c.size(), r = c.rank();
  for (std::size_t length : {1u, 3u, 7u, 1000u, 100003u}) {  // not multiples of the rank count
    std::vector<float> data(length);
    for (std::size_t i = 0; i < length; ++i) data[i] = static_cast<float>((r + 1) * static_cast<int>(i % 97)) * 0.5f;
    c.all_reduce(data);
    const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < length; ++i)
      ASSERT_EQ(data[i], ranks_sum * static_cast<float>(i % 97) * 0.5f) << "length " << length << " element " << i;
  }
}

TEST(CollectiveConformance, AllReduceOfDoublesAndMaxMin) {
  auto& c = collective();
  const int n = c.size(), r = c.rank();
  std::vector<double> d{1e-9 * (r + 1), static_cast<double>(r)};
  c.all_reduce(d);
  EXPECT_DOUBLE_EQ(d[0], 1e-9 * n * (n + 1) / 2);
  EXPECT_EQ(d[1], static_cast<double>(n * (n - 1) / 2));
  std::vector<float> m{static_cast<float>(r), -static_cast<float>(r)};
  c.all_reduce(m, loom::ReduceOp::max);
  EXPECT_EQ(m[0], static_cast<float>(n - 1));
  EXPECT_EQ(m[1], 0.0f);
  std::vector<double> lo{static_cast<double>(r) + 2};
  c.all_reduce(lo, loom::ReduceOp::min);
  EXPECT_EQ(lo[0], 2.0);
}

TEST(CollectiveConformance, ReduceScatterGivesEachRankTheSumOfItsChunk) {
  auto& c = collective();
  const int n = c.size(), r = c.rank();
  const std::size_t chunk = 5;
  std::vector<float> in(chunk * n);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i + 100 * r);
  std::vector<float> out(chunk, -1.0f);
  c.reduce_scatter(in, out);
  for (std::size_t j = 0; j < chunk; ++j) {
    const std::size_t i = static_cast<std::size_t>(r) * chunk + j;
    EXPECT_EQ(out[j], static_cast<float>(n * i + 100 * n * (n - 1) / 2)) << j;
  }
}

TEST(CollectiveConformance, AllGatherConcatenatesInRankOrder) {
  auto& c = collective();
  const int n = c.size(), r = c.rank();
  std::vector<float> in{static_cast<float>(r), static_cast<float>(10 * r), 0.5f};
  std::vector<float> out(3 * n);
  c.all_gather(in, out);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(out[3 * k], static_cast<float>(k));
    EXPECT_EQ(out[3 * k + 1], static_cast<float>(10 * k));
    EXPECT_EQ(out[3 * k + 2], 0.5f);
  }
}

TEST(CollectiveConformance, BroadcastCopiesTheRootsBytes) {
  auto& c = collective();
  std::string text = c.rank() == 0 ? "rank zero's config hash" : std::string(23, '?');
  c.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), 0);
  EXPECT_EQ(text, "rank zero's config hash");
  c.barrier();
}

TEST(CollectiveConformance, StartedAllReducesOverlapAndEqualTheBlockingOne) {
  auto& c = collective();
  const int r = c.rank();
  std::vector<std::vector<float>> buckets(4, std::vector<float>(4099));
  for (std::size_t b = 0; b < buckets.size(); ++b)
    for (std::size_t i = 0; i < buckets[b].size(); ++i) buckets[b][i] = 0.1f * static_cast<float>(i) + 0.37f * r + b;
  auto expected = buckets;
  for (auto& e : expected) c.all_reduce(e);
  std::vector<std::unique_ptr<loom::Collective::Pending>> pending;
  for (auto& b : buckets) pending.push_back(c.start_all_reduce(b));
  for (auto& p : pending) p->wait();
  for (std::size_t b = 0; b < buckets.size(); ++b) EXPECT_EQ(buckets[b], expected[b]) << "bucket " << b;
}

// The process's peak resident memory so far (VmHWM), in bytes; 0 where /proc does not say.
std::size_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// In-place reduce_scatter, all_gather and all_reduce of all of `buffer` (and of `spare`, as
// long) on `g`: the sums in rank order, and the peak resident memory raised by less than a
// quarter of the buffer.
void check_in_place_reductions(loom::CollectiveGroup& g, std::vector<float>& buffer, std::vector<float>& spare) {
  const int n = g.size(), r = g.rank();
  const std::size_t chunk = buffer.size() / static_cast<std::size_t>(n);
  // Sums that round (so their order shows), from divisions (which no compiler fuses into an FMA).
  auto value = [](int rank, std::size_t i) {
    return static_cast<float>(i % 1021) / 7.0f + static_cast<float>(rank) / 3.0f;
  };
  auto sum = [&](std::size_t i) {
    float e = value(0, i);
    for (int k = 1; k < n; ++k) e += value(k, i);  // ((r0 + r1) + r2) + ...
    return e;
  };
  std::span<float> whole(buffer.data(), chunk * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < whole.size(); ++i) whole[i] = value(r, i);
  const std::size_t before = peak_resident_bytes();
  // Counted, not asserted: a rank that left the test early would leave its peers waiting.
  std::size_t wrong = 0;

  std::span<float> mine(whole.data() + static_cast<std::size_t>(r) * chunk, chunk);
  g.reduce_scatter(whole, mine);
  for (std::size_t j = 0; j < chunk; j += 4099) wrong += mine[j] != sum(static_cast<std::size_t>(r) * chunk + j);
  wrong += mine[chunk - 1] != sum(static_cast<std::size_t>(r + 1) * chunk - 1);
  EXPECT_EQ(wrong, 0u) << "elements of the in-place reduce_scatter differ from the sum in rank order";
  for (std::size_t j = 0; j < chunk; ++j) mine[j] = static_cast<float>(r);
  g.all_gather(mine, whole);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(whole[static_cast<std::size_t>(k) * chunk], static_cast<float>(k));
    EXPECT_EQ(whole[static_cast<std::size_t>(k + 1) * chunk - 1], static_cast<float>(k));
  }
  // An all-reduce of a length that no rank count divides, in place too.
  std::span<float> odd(spare.data(), spare.size() - 1);
  for (std::size_t i = 0; i < odd.size(); ++i) odd[i] = value(r, i);
  g.all_reduce(odd);
  wrong = 0;
  for (std::size_t i = 0; i < odd.size(); i += 4099) wrong += odd[i] != sum(i);
  wrong += odd.back() != sum(odd.size() - 1);
  EXPECT_EQ(wrong, 0u) << "elements of the all-reduce differ from the sum in rank order";

  if (before == 0) return;  // no /proc: the sums are checked, the memory cannot be
  const std::size_t grown = peak_resident_bytes() - before;
  EXPECT_LT(grown, buffer.size() * sizeof(float) / 4)
      << "the reductions of a " << buffer.size() * sizeof(float) / (1 << 20) << " MiB buffer raised the peak by "
      << grown / (1 << 20) << " MiB";
}

// A ZeRO-1 run reduce-scatters and all-gathers every gradient at once, in place in its gradient
// buffer: the collective may take memory of its own, but not in proportion to the buffer (a
// scratch as large as the buffer cost such a run more than its sharded optimizer state saved).
// And each element is still summed in rank order, piece after piece. On the world and on every
// group (a data-axis group carries a ZeRO-1 run's gradients).
TEST(CollectiveConformance, InPlaceReductionsOfALargeBufferTakeLittleMemoryAndSumInRankOrder) {
  auto& c = collective();
  const auto groups = axis_groups();  // made before any baseline
  const std::size_t elements = ((std::size_t{48} << 20) / sizeof(float) / static_cast<std::size_t>(c.size()) + 13) *
                               static_cast<std::size_t>(c.size());
  // Written in full: resident before any baseline.
  std::vector<float> buffer(elements, 1.0f), spare(elements, 1.0f);
  {
    SCOPED_TRACE("the world (rank " + std::to_string(c.rank()) + ")");
    check_in_place_reductions(c, buffer, spare);
  }
  for (const AxisGroup& g : groups) {
    SCOPED_TRACE(g.label);
    check_in_place_reductions(*g.group, buffer, spare);
  }
}

TEST(CollectiveConformance, MisSizedBuffersAreInternalErrors) {
  auto& c = collective();
  std::vector<float> in(3), out(3 * c.size() + 1);
  EXPECT_THROW(c.all_gather(in, out), loom::InternalError);
  EXPECT_THROW(c.reduce_scatter(out, in), loom::InternalError);
}

// ---- Groups: the ranks along one axis of a mesh ----------------------------------------------

TEST(CollectiveConformance, GroupsHoldTheRanksAlongTheirAxisInCoordinateOrder) {
  auto& c = collective();
  for (const AxisGroup& g : axis_groups()) {
    SCOPED_TRACE(g.label);
    EXPECT_EQ(g.group->size(), g.mesh.size(g.axis));
    EXPECT_EQ(g.group->rank(), g.mesh.coordinate(c.rank(), g.axis));
    // Each member's world rank, gathered in group order, is the mesh's list of members.
    std::vector<float> ranks(static_cast<std::size_t>(g.group->size()));
    g.group->all_gather(std::vector<float>{static_cast<float>(c.rank())}, ranks);
    for (std::size_t k = 0; k < ranks.size(); ++k) EXPECT_EQ(ranks[k], static_cast<float>(g.members[k])) << k;
  }
}

TEST(CollectiveConformance, EveryOperationWorksOnEveryGroup) {
  auto& c = collective();
  const int me = c.rank();
  for (const AxisGroup& g : axis_groups()) {
    SCOPED_TRACE(g.label);
    const int n = g.group->size();
    long long member_sum = 0;
    for (int m : g.members) member_sum += m + 1;
    // all_reduce, float (not a multiple of the group's size) and double; max and min.
    std::vector<float> data(1001);
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<float>((me + 1) * static_cast<int>(i % 97)) * 0.5f;
    g.group->all_reduce(data);
    // Counted, not asserted: a rank that left the test early would leave its peers waiting.
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < data.size(); ++i)
      wrong += data[i] != static_cast<float>(member_sum) * static_cast<float>(i % 97) * 0.5f;
    EXPECT_EQ(wrong, 0u) << "elements of the all-reduce differ from the members' sum";
    std::vector<double> d{static_cast<double>(me + 1), 1.0};
    g.group->all_reduce(d);
    EXPECT_EQ(d[0], static_cast<double>(member_sum));
    EXPECT_EQ(d[1], static_cast<double>(n));
    std::vector<float> m{static_cast<float>(me), -static_cast<float>(me)};
    g.group->all_reduce(m, loom::ReduceOp::max);
    EXPECT_EQ(m[0], static_cast<float>(g.members.back()));
    EXPECT_EQ(m[1], -static_cast<float>(g.members.front()));
    std::vector<double> lo{static_cast<double>(me)};
    g.group->all_reduce(lo, loom::ReduceOp::min);
    EXPECT_EQ(lo[0], static_cast<double>(g.members.front()));

    // reduce_scatter: member k receives the sum of chunk k.
    const std::size_t chunk = 5;
    std::vector<float> in(chunk * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) + 100.0f * static_cast<float>(me);
    std::vector<float> out(chunk, -1.0f);
    g.group->reduce_scatter(in, out);
    long long ranks_sum = 0;
    for (int r : g.members) ranks_sum += r;
    for (std::size_t j = 0; j < chunk; ++j) {
      const std::size_t i = static_cast<std::size_t>(g.group->rank()) * chunk + j;
      EXPECT_EQ(out[j], static_cast<float>(static_cast<long long>(n) * static_cast<long long>(i) + 100 * ranks_sum))
          << j;
    }

    // all_gather: every member's input, in group order.
    std::vector<float> mine{static_cast<float>(me), 0.5f};
    std::vector<float> all(2 * static_cast<std::size_t>(n));
    g.group->all_gather(mine, all);
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(all[2 * k], static_cast<float>(g.members[static_cast<std::size_t>(k)]));
      EXPECT_EQ(all[2 * k + 1], 0.5f);
    }

    // broadcast from every member in turn (roots are group ranks).
    for (int root = 0; root < n; ++root) {
      std::string text = g.group->rank() == root ? "world rank " + std::to_string(me) + "   " : std::string(14, '?');
      text.resize(14, ' ');
      g.group->broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
      std::string expected = "world rank " + std::to_string(g.members[static_cast<std::size_t>(root)]) + "   ";
      expected.resize(14, ' ');
      EXPECT_EQ(text, expected) << "root " << root;
    }
    g.group->barrier();

    // start_all_reduce: the blocking result, bit for bit.
    std::vector<std::vector<float>> buckets(3, std::vector<float>(2053));
    for (std::size_t b = 0; b < buckets.size(); ++b)
      for (std::size_t i = 0; i < buckets[b].size(); ++i) buckets[b][i] = rounding(g.group->rank(), i + 7 * b);
    auto expected = buckets;
    for (auto& e : expected) g.group->all_reduce(e);
    std::vector<std::unique_ptr<loom::CollectiveGroup::Pending>> pending;
    for (auto& b : buckets) pending.push_back(g.group->start_all_reduce(b));
    for (auto& p : pending) p->wait();
    for (std::size_t b = 0; b < buckets.size(); ++b) EXPECT_TRUE(same_bits(buckets[b], expected[b])) << "bucket " << b;

    // Mis-sized buffers.
    std::vector<float> small(3), large(3 * static_cast<std::size_t>(n) + 1);
    EXPECT_THROW(g.group->all_gather(small, large), loom::InternalError);
    EXPECT_THROW(g.group->reduce_scatter(large, small), loom::InternalError);
  }
}

// The determinism rule: the same inputs give the same bits on every member, in every group of the
// same size (the groups along one axis of a mesh), and on every repeat.
TEST(CollectiveConformance, GroupReductionsAreTheSameBitsOnEveryRankAndGroupAndRepeat) {
  for (const AxisGroup& g : axis_groups()) {
    SCOPED_TRACE(g.label);
    const int n = g.group->size();
    std::vector<float> inputs(4099);
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = rounding(g.group->rank(), i);
    std::vector<float> first = inputs;
    g.group->all_reduce(first);
    for (int repeat = 0; repeat < 3; ++repeat) {
      std::vector<float> again = inputs;
      if (repeat % 2 == 0)
        g.group->all_reduce(again);
      else
        g.group->start_all_reduce(again)->wait();
      EXPECT_TRUE(same_bits(again, first)) << "repeat " << repeat;
    }
    // Every rank of the world holds the same bits: the members of one group, and the members of
    // the other groups along the axis, which reduced the same inputs.
    const auto everyone = from_every_rank(first);
    for (std::size_t r = 0; r < everyone.size(); ++r) EXPECT_TRUE(same_bits(everyone[r], first)) << "world rank " << r;

    // reduce_scatter: the chunk a member receives is the same bits in every group, and the same
    // as that chunk of the all-reduce.
    const std::size_t chunk = 1031;
    std::vector<float> in(chunk * static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < in.size(); ++i) in[i] = rounding(g.group->rank(), i + 11);
    std::vector<float> out(chunk);
    g.group->reduce_scatter(in, out);
    std::vector<float> whole = in;
    g.group->all_reduce(whole);
    const std::vector<float> my_chunk(whole.begin() + static_cast<std::ptrdiff_t>(chunk * g.group->rank()),
                                      whole.begin() + static_cast<std::ptrdiff_t>(chunk * (g.group->rank() + 1)));
    EXPECT_TRUE(same_bits(out, my_chunk)) << "reduce_scatter differs from the all-reduce's chunk";
    std::vector<float> tagged = out;
    tagged.push_back(static_cast<float>(g.group->rank()));
    const auto chunks = from_every_rank(tagged);
    for (std::size_t r = 0; r < chunks.size(); ++r) {
      if (chunks[r].back() == tagged.back()) {
        EXPECT_TRUE(same_bits(chunks[r], tagged)) << "world rank " << r;
      }
    }
  }
}

// Operations of several groups and the world, started and interleaved on the step's thread,
// complete with the results each would have alone.
TEST(CollectiveConformance, OperationsOfDifferentGroupsInterleave) {
  auto& c = collective();
  const loom::Mesh mesh = meshes().size() > 1 ? meshes()[meshes().size() / 2] : meshes().front();
  auto data_group = c.group(mesh, loom::MeshAxis::data), fsdp_group = c.group(mesh, loom::MeshAxis::fsdp);
  std::vector<std::vector<float>> buffers(6, std::vector<float>(777));
  for (std::size_t b = 0; b < buffers.size(); ++b)
    for (std::size_t i = 0; i < buffers[b].size(); ++i) buffers[b][i] = rounding(c.rank(), i + b);
  loom::CollectiveGroup* groups[] = {data_group.get(), fsdp_group.get(), &c};
  auto expected = buffers;
  for (std::size_t b = 0; b < buffers.size(); ++b) groups[b % 3]->all_reduce(expected[b]);
  std::vector<std::unique_ptr<loom::CollectiveGroup::Pending>> pending;
  for (std::size_t b = 0; b < buffers.size(); ++b) pending.push_back(groups[b % 3]->start_all_reduce(buffers[b]));
  double total = 1.0;
  c.all_reduce(std::span<double>(&total, 1));  // a blocking world operation behind them
  EXPECT_EQ(total, static_cast<double>(c.size()));
  for (auto& p : pending) p->wait();
  for (std::size_t b = 0; b < buffers.size(); ++b)
    EXPECT_TRUE(same_bits(buffers[b], expected[b])) << "buffer " << b << " (" << mesh.describe() << ")";
}

TEST(CollectiveConformance, AGroupOfAMeshOfAnotherWorldSizeIsAnInternalError) {
  auto& c = collective();
  EXPECT_THROW(c.group(loom::Mesh(loom::Mesh::Sizes{c.size() + 1, 1, 1}), loom::MeshAxis::data), loom::InternalError);
}

}  // namespace
