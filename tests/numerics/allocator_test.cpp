#include <gtest/gtest.h>

#include <loom/allocator.hpp>
#include <loom/tensor.hpp>
#include <thread>
#include <vector>

namespace loom {
namespace {

TEST(Allocator, ReleasedBuffersAreReused) {
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({1000, 7});
    first = t.raw_data();
  }
  const AllocatorStats before = allocator_stats();
  Tensor again = Tensor::empty({1000, 7});
  const AllocatorStats after = allocator_stats();
  EXPECT_EQ(again.raw_data(), first);
  EXPECT_EQ(after.requests - before.requests, 1u);
  EXPECT_EQ(after.cache_hits - before.cache_hits, 1u);
  EXPECT_EQ(after.system_allocations, before.system_allocations);
}

TEST(Allocator, NearbySizesShareAClass) {
  const void* first = nullptr;
  {
    Tensor t = Tensor::empty({10000});
    first = t.raw_data();
  }
  // 40000 and 40400 bytes round to one class (classes are 1/32 of a power of two apart).
  Tensor u = Tensor::empty({10100});
  EXPECT_EQ(u.raw_data(), first);
  EXPECT_GE(u.storage_bytes(), 40400u);
  EXPECT_LE(u.storage_bytes(), 40400u + 40400u / 16);
}

TEST(Allocator, AlignmentAndHugeBlocks) {
  for (std::int64_t n : {1, 17, 1000, 123457}) {
    Tensor t = Tensor::empty({n});
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % 64, 0u) << n;
  }
  Tensor big = Tensor::empty({3 << 20});  // 12 MiB
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(big.raw_data()) % (2u << 20), 0u);
}

TEST(Allocator, StatisticsTrackUseAndReleaseCached) {
  allocator_reset_peak();
  const AllocatorStats base = allocator_stats();
  {
    Tensor a = Tensor::empty({1 << 16});
    Tensor b = Tensor::empty({1 << 16});
    const AllocatorStats mid = allocator_stats();
    EXPECT_GE(mid.bytes_in_use - base.bytes_in_use, 2u * (1u << 18));
    EXPECT_GE(mid.peak_bytes_in_use, mid.bytes_in_use);
  }
  const AllocatorStats after = allocator_stats();
  EXPECT_EQ(after.bytes_in_use, base.bytes_in_use);
  EXPECT_GE(after.bytes_cached, 2u * (1u << 18));
  allocator_release_cached();
  EXPECT_EQ(allocator_stats().bytes_cached, 0u);
}

TEST(Allocator, ConcurrentUseIsSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 2000; ++i) {
        Tensor a = Tensor::full({(i % 7) * 100 + t + 1}, 1.0f);
        Tensor b = a;
        ASSERT_EQ(b.data<float>()[0], 1.0f);
      }
    });
  for (auto& th : threads) th.join();
  const AllocatorStats s = allocator_stats();
  EXPECT_EQ(s.requests, s.cache_hits + s.system_allocations);
}

}  // namespace
}  // namespace loom
