// The execution context: the core's one thread pool, as plugins see it.
//
// The core owns the threads (a TBB arena sized from config or nproc) and OpenBLAS's thread
// count; plugins receive this context and never start pools of their own. Nested
// oversubscription (threaded BLAS inside threaded loops) is a bug.
#pragma once

#include <cstdint>
#include <functional>

namespace loom {

class ExecutionContext {
 public:
  virtual ~ExecutionContext();

  // Worker threads available to parallel_for (the caller's thread included).
  virtual int num_threads() const = 0;

  // Calls body(begin, end) over disjoint chunks covering [0, n), each at least `grain` long
  // except possibly the last, on the core's pool, and returns when all are done. The chunking
  // depends only on n, grain and num_threads(), so results that combine chunks in chunk order
  // are deterministic for a given thread count.
  virtual void parallel_for(std::int64_t n, std::int64_t grain,
                            const std::function<void(std::int64_t, std::int64_t)>& body) const = 0;
};

// The process's default context (all cores), created on first use by the core.
ExecutionContext& default_execution_context();

}  // namespace loom
