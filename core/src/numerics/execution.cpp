// The core's thread pool: one TBB arena, and OpenBLAS held to one thread for the whole process.
//
// Why one BLAS thread, always (see execution.hpp, "BLAS policy"): OpenBLAS's pthread server is a
// second pool. Its threads spin after every threaded call, competing with the arena's workers
// for the same cores, and its thread count is process-global, so it cannot be lowered for the
// BLAS calls made inside parallel loops without racing other callers. Backends instead split
// large GEMMs into panels over this arena, one single-threaded BLAS call per panel; measured on
// GPT-2 shapes that matches OpenBLAS's own threading (benchmarks/ reports the ratio).
#include "loom/execution.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "loom/error.hpp"

extern "C" void openblas_set_num_threads(int);

namespace loom {

ExecutionContext::~ExecutionContext() = default;

namespace {

void hold_blas_to_one_thread() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

class TbbExecutionContext final : public ExecutionContext {
 public:
  explicit TbbExecutionContext(int threads) : threads_(std::max(1, threads)), arena_(threads_) {
    hold_blas_to_one_thread();
  }

  int num_threads() const override { return threads_; }

  void parallel_for(std::int64_t n, std::int64_t grain,
                    FunctionRef<void(std::int64_t, std::int64_t)> body) const override {
    if (n <= 0) return;
    grain = std::max<std::int64_t>(1, grain);
    const std::int64_t chunks = std::min<std::int64_t>(n / grain, std::int64_t{threads_} * 4);
    if (threads_ == 1 || chunks <= 1) {
      body(0, n);
      return;
    }
    // Chunk boundaries depend only on n, grain and the thread count; TBB only decides which
    // worker runs which chunk.
    const std::int64_t step = (n + chunks - 1) / chunks;
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<std::int64_t>(0, chunks, 1),
          [&](const tbb::blocked_range<std::int64_t>& r) {
            for (std::int64_t c = r.begin(); c != r.end(); ++c) {
              const std::int64_t begin = c * step;
              const std::int64_t end = std::min(n, begin + step);
              if (begin < end) body(begin, end);
            }
          },
          tbb::simple_partitioner());
    });
  }

 private:
  int threads_;
  mutable tbb::task_arena arena_;
};

int default_thread_count() {
  if (const char* env = std::getenv("LOOM_NUM_THREADS"); env && *env) {
    char* end = nullptr;
    const long v = std::strtol(env, &end, 10);
    if (end && *end == '\0' && v >= 1 && v <= 4096) return static_cast<int>(v);
    throw UserError("LOOM_NUM_THREADS must be a positive integer, not '" + std::string(env) + "'");
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  // Under mpirun, the ranks on this node share its cores: each takes its part, so that N ranks
  // of one thread do not start N pools of every core.
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE"); local && *local) {
    const long ranks = std::strtol(local, nullptr, 10);
    if (ranks > 1) return std::max(1, cores / static_cast<int>(ranks));
  }
  return cores;
}

}  // namespace

ExecutionContext& default_execution_context() {
  static TbbExecutionContext context(default_thread_count());
  return context;
}

std::unique_ptr<ExecutionContext> make_execution_context(int threads) {
  if (threads < 1) throw InternalError("make_execution_context: threads must be >= 1, not " + std::to_string(threads));
  return std::make_unique<TbbExecutionContext>(threads);
}

}  // namespace loom
