// The `collective` contract, on the plugin named by LOOM_TEST_COLLECTIVE (default `single`),
// through the real plugin host. Run as one process for `single` and under `mpirun -np N` for
// `mpi`: every rank runs every test, with inputs that depend on its rank, and checks the exact
// result (the inputs are small integers and halves, so every sum is exact in float32).
#include "loom/kinds/collective.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"

namespace {

std::string collective_name() {
  const char* name = std::getenv("LOOM_TEST_COLLECTIVE");
  return name ? name : "single";
}

loom::Collective& collective() {
  static loom::Registry registry;
  static loom::Handle<loom::Collective> handle = [] {
    loom::PluginHost host;
    host.load({{LOOM_PLUGIN_DIR, "test"}}, registry);
    const std::string name = collective_name();
    return registry.create<loom::Collective>({"collective", name, loom::Value(name), "collective"});
  }();
  return *handle;
}

TEST(Collective, RankAndSize) {
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

TEST(Collective, AllReduceSumsEveryRanksValuesWhateverTheLength) {
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

TEST(Collective, AllReduceOfDoublesAndMaxMin) {
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

TEST(Collective, ReduceScatterGivesEachRankTheSumOfItsChunk) {
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

TEST(Collective, AllGatherConcatenatesInRankOrder) {
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

TEST(Collective, BroadcastCopiesTheRootsBytes) {
  auto& c = collective();
  std::string text = c.rank() == 0 ? "rank zero's config hash" : std::string(23, '?');
  c.broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), 0);
  EXPECT_EQ(text, "rank zero's config hash");
  c.barrier();
}

TEST(Collective, StartedAllReducesOverlapAndEqualTheBlockingOne) {
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

// The process's peak resident memory so far (VmHWM), in bytes.
std::size_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

// A ZeRO-1 run reduce-scatters and all-gathers every gradient at once, in place in its gradient
// buffer: the collective may take memory of its own, but not in proportion to the buffer (a
// scratch as large as the buffer cost such a run more than its sharded optimizer state saved).
// And each element is still summed in rank order, piece after piece.
TEST(Collective, InPlaceReductionsOfALargeBufferTakeLittleMemoryAndSumInRankOrder) {
  auto& c = collective();
  const int n = c.size(), r = c.rank();
  const std::size_t chunk = (std::size_t{48} << 20) / sizeof(float) / static_cast<std::size_t>(n) + 13;
  // Sums that round (so their order shows), from divisions (which no compiler fuses into an FMA).
  auto value = [](int rank, std::size_t i) {
    return static_cast<float>(i % 1021) / 7.0f + static_cast<float>(rank) / 3.0f;
  };
  std::vector<float> buffer(chunk * n);  // written in full: resident before the baseline
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = value(r, i);
  std::vector<float> copy(buffer.size());  // for the all-reduce below, resident too
  const std::size_t before = peak_resident_bytes();
  ASSERT_GT(before, 0u);

  std::span<float> mine(buffer.data() + static_cast<std::size_t>(r) * chunk, chunk);
  c.reduce_scatter(buffer, mine);
  for (std::size_t j = 0; j < chunk; j += 4099) {
    const std::size_t i = static_cast<std::size_t>(r) * chunk + j;
    float expected = value(0, i);
    for (int k = 1; k < n; ++k) expected += value(k, i);  // ((r0 + r1) + r2) + ...
    ASSERT_EQ(mine[j], expected) << "element " << j;
  }
  for (std::size_t j = 0; j < chunk; ++j) mine[j] = static_cast<float>(r);
  c.all_gather(mine, buffer);
  for (int k = 0; k < n; ++k) {
    EXPECT_EQ(buffer[static_cast<std::size_t>(k) * chunk], static_cast<float>(k));
    EXPECT_EQ(buffer[static_cast<std::size_t>(k + 1) * chunk - 1], static_cast<float>(k));
  }
  // An all-reduce of a length that no rank count divides, in place too.
  std::span<float> odd(copy.data(), copy.size() - 1);
  for (std::size_t i = 0; i < odd.size(); ++i) odd[i] = value(r, i);
  c.all_reduce(odd);
  for (std::size_t i = 0; i < odd.size(); i += 4099) {
    float expected = value(0, i);
    for (int k = 1; k < n; ++k) expected += value(k, i);
    ASSERT_EQ(odd[i], expected) << "element " << i;
  }
  EXPECT_EQ(odd.back(), [&] {
    float e = value(0, odd.size() - 1);
    for (int k = 1; k < n; ++k) e += value(k, odd.size() - 1);
    return e;
  }());

  const std::size_t grown = peak_resident_bytes() - before;
  EXPECT_LT(grown, buffer.size() * sizeof(float) / 4)
      << "the reductions of a " << buffer.size() * sizeof(float) / (1 << 20) << " MiB buffer raised the peak by "
      << grown / (1 << 20) << " MiB";
}

TEST(Collective, MisSizedBuffersAreInternalErrors) {
  auto& c = collective();
  std::vector<float> in(3), out(3 * c.size() + 1);
  EXPECT_THROW(c.all_gather(in, out), loom::InternalError);
  EXPECT_THROW(c.reduce_scatter(out, in), loom::InternalError);
}

}  // namespace
