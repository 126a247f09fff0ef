#include <gtest/gtest.h>

#include <atomic>
#include <loom/execution.hpp>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

extern "C" int openblas_get_num_threads(void);

namespace loom {
namespace {

TEST(Execution, ParallelForCoversTheRangeOnceInDeterministicChunks) {
  auto ctx = make_execution_context(2);
  for (std::int64_t n : {1, 7, 100, 1001}) {
    for (std::int64_t grain : {1, 3, 64}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::mutex m;
      std::set<std::pair<std::int64_t, std::int64_t>> chunks;
      ctx->parallel_for(n, grain, [&](std::int64_t b, std::int64_t e) {
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
        std::lock_guard<std::mutex> lock(m);
        chunks.insert({b, e});
      });
      for (auto& h : hits) EXPECT_EQ(h.load(), 1);
      const std::int64_t expected = std::max<std::int64_t>(1, std::min<std::int64_t>(n / grain, 8));
      EXPECT_LE(static_cast<std::int64_t>(chunks.size()), expected) << n << " " << grain;
      for (auto [b, e] : chunks) {
        if (e != n) {
          EXPECT_GE(e - b, grain);
        }
      }
    }
  }
}

TEST(Execution, SmallLoopsRunInlineOnTheCaller) {
  auto ctx = make_execution_context(2);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  ctx->parallel_for(10, 10, [&](std::int64_t b, std::int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(b, 0);
    EXPECT_EQ(e, 10);
    ++calls;
  });
  EXPECT_EQ(calls, 1);
  auto serial = make_execution_context(1);
  EXPECT_EQ(serial->num_threads(), 1);
  serial->parallel_for(1000, 1, [&](std::int64_t b, std::int64_t e) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(e - b, 1000);
  });
}

TEST(Execution, PanelsRunAsSeparateTasksAndNest) {
  auto ctx = make_execution_context(2);
  std::atomic<int> panels{0}, inner{0};
  ctx->parallel_for(2, 1, [&](std::int64_t b, std::int64_t e) {
    EXPECT_EQ(e - b, 1);
    panels++;
    ctx->parallel_for(100, 10, [&](std::int64_t ib, std::int64_t ie) { inner += static_cast<int>(ie - ib); });
  });
  EXPECT_EQ(panels.load(), 2);
  EXPECT_EQ(inner.load(), 200);
}

TEST(Execution, ExceptionsPropagate) {
  auto ctx = make_execution_context(2);
  EXPECT_THROW(ctx->parallel_for(100, 1,
                                 [](std::int64_t b, std::int64_t) {
                                   if (b == 0) throw std::runtime_error("boom");
                                 }),
               std::runtime_error);
}

TEST(Execution, BlasIsHeldToOneThread) {
  (void)default_execution_context();
  EXPECT_EQ(openblas_get_num_threads(), 1);
}

TEST(Execution, FunctionRefCallsWithoutOwning) {
  int total = 0;
  auto add = [&](int v) { total += v; };
  FunctionRef<void(int)> ref(add);
  ref(3);
  ref(4);
  EXPECT_EQ(total, 7);
}

}  // namespace
}  // namespace loom
