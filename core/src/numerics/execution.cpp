// The core's thread pool: one TBB arena for the process, and OpenBLAS held to one thread per
// caller so that BLAS calls made inside parallel loops never oversubscribe.
#include "loom/execution.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <thread>

extern "C" void openblas_set_num_threads(int);

namespace loom {

ExecutionContext::~ExecutionContext() = default;

namespace {

class TbbExecutionContext final : public ExecutionContext {
 public:
  explicit TbbExecutionContext(int threads) : threads_(std::max(1, threads)), arena_(threads_) {}

  int num_threads() const override { return threads_; }

  void parallel_for(std::int64_t n, std::int64_t grain,
                    const std::function<void(std::int64_t, std::int64_t)>& body) const override {
    if (n <= 0) return;
    grain = std::max<std::int64_t>(1, grain);
    if (threads_ == 1 || n <= grain) {
      body(0, n);
      return;
    }
    // A fixed partition: chunk boundaries depend only on n, grain and the thread count.
    const std::int64_t chunks = std::min<std::int64_t>((n + grain - 1) / grain, std::int64_t{threads_} * 4);
    const std::int64_t step = (n + chunks - 1) / chunks;
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<std::int64_t>(0, chunks, 1), [&](const tbb::blocked_range<std::int64_t>& r) {
        for (std::int64_t c = r.begin(); c != r.end(); ++c) {
          const std::int64_t begin = c * step;
          const std::int64_t end = std::min(n, begin + step);
          if (begin < end) body(begin, end);
        }
      }, tbb::simple_partitioner());
    });
  }

 private:
  int threads_;
  mutable tbb::task_arena arena_;
};

}  // namespace

ExecutionContext& default_execution_context() {
  static TbbExecutionContext context([] {
    openblas_set_num_threads(1);
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return context;
}

}  // namespace loom
