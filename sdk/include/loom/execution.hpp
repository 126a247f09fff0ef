// The execution context: the core's one thread pool, as plugins see it.
//
// The core owns the threads (a TBB arena sized from config or nproc) and OpenBLAS's thread
// count; plugins receive this context and never start pools of their own. Nested
// oversubscription (threaded BLAS inside threaded loops) is a bug.
//
// BLAS policy. The core sets OpenBLAS to one thread for the whole process, once, and never
// changes it. A backend that wants a large GEMM to use every core splits it into panels and runs
// one single-threaded BLAS call per panel through parallel_for (the `cpu` backend does). So:
//   * BLAS may be called from any parallel_for body: it runs on the calling thread only;
//   * OpenBLAS's own worker threads are never woken, so they never compete with the pool;
//   * a backend decides how a GEMM is split; the `cpu` backend splits so that results do not
//     depend on the thread count (see plugins/backend/cpu/gemm.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

namespace loom {

// A non-owning reference to a callable, for loop bodies: unlike std::function it never
// allocates and costs one indirect call. The referenced callable must outlive every call made
// through the reference (pass lambdas directly as arguments).
template <class Signature>
class FunctionRef;

template <class R, class... Args>
class FunctionRef<R(Args...)> {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::remove_cvref_t<F>, FunctionRef> &&
                                              std::is_invocable_r_v<R, F&, Args...>>>
  FunctionRef(F&& f) noexcept  // NOLINT(google-explicit-constructor): used like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, Args... args) -> R {
          return (*static_cast<std::remove_reference_t<F>*>(object))(std::forward<Args>(args)...);
        }) {}

  R operator()(Args... args) const { return call_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  R (*call_)(void*, Args...);
};

class ExecutionContext {
 public:
  virtual ~ExecutionContext();

  // Threads that parallel_for runs bodies on (the caller's thread included).
  virtual int num_threads() const = 0;

  // Calls body(begin, end) over disjoint chunks covering [0, n) and returns when all are done.
  //  * Chunks are at least `grain` long (except possibly the last); n < 2 * grain, or a context
  //    with one thread, runs body(0, n) on the calling thread with no synchronisation at all.
  //  * The chunking depends only on n, grain and num_threads(): there are
  //    max(1, min(floor(n / grain), 4 * num_threads())) chunks of equal length ceil(n / chunks)
  //    (the last one shorter, never empty).
  //    In particular parallel_for(p, 1, ...) with p <= 4 * num_threads() calls the body once per
  //    index, each as its own task: the way to run p panels of similar cost.
  //  * Which thread runs which chunk is unspecified: a body must write disjoint memory. Results
  //    that combine per-chunk values in chunk order are deterministic for a given thread count;
  //    kernels that want results independent of the thread count choose their own chunks and
  //    call parallel_for over chunk indices.
  //  * Bodies may call parallel_for again (nested loops run on the same pool) and may call BLAS
  //    (single-threaded, see above). An exception thrown by a body propagates to the caller once
  //    the other chunks have finished.
  //  * Does not allocate memory once the pool is warm.
  virtual void parallel_for(std::int64_t n, std::int64_t grain,
                            FunctionRef<void(std::int64_t, std::int64_t)> body) const = 0;
};

// The process's default context (all cores, or LOOM_NUM_THREADS when set), created on first use.
ExecutionContext& default_execution_context();

// A context with its own arena of `threads` threads (>= 1). For tests and tools that need a
// fixed thread count; a run uses one context for everything.
std::unique_ptr<ExecutionContext> make_execution_context(int threads);

}  // namespace loom
