// A warmed-up training step allocates nothing: neither from the system allocator (malloc,
// operator new, aligned_alloc, counted by replacing them in this executable, which interposes
// them for every library of the process) nor as a miss of loom's tensor allocator.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <loom/allocator.hpp>

#include "numerics_test_support.hpp"
#include "tiny_model.hpp"

extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);
void __libc_free(void*);
}

namespace {
std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
inline void note() {
  if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace

extern "C" {
void* malloc(std::size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(std::size_t n, std::size_t size) {
  note();
  return __libc_calloc(n, size);
}
void* realloc(void* p, std::size_t n) {
  note();
  return __libc_realloc(p, n);
}
void free(void* p) {
  __libc_free(p);
}
void* aligned_alloc(std::size_t alignment, std::size_t n) {
  note();
  return __libc_memalign(alignment, n);
}
void* memalign(std::size_t alignment, std::size_t n) {
  note();
  return __libc_memalign(alignment, n);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t n) {
  note();
  *out = __libc_memalign(alignment, n);
  return *out ? 0 : 12;  // ENOMEM
}
}

namespace loom::test {
namespace {

struct StepCounts {
  long mallocs;
  std::uint64_t requests, system_allocations;
};

StepCounts run_steps(TinyModel& model, Ops& ops, Tape& tape, AttentionKernel& attention, std::uint64_t first, int steps,
                     bool count) {
  const AllocatorStats before = allocator_stats();
  allocations = 0;
  counting = count;
  for (int s = 0; s < steps; ++s) {
    const std::uint64_t step = first + static_cast<std::uint64_t>(s);
    auto [tokens, targets] = model.batch(step);
    ops.set_dropout_seed(11, step);
    Tensor loss = model.loss(ops, attention, tokens, targets);
    tape.backward(loss);
    for (Parameter& p : model.parameters()) p.zero_grad();
  }
  counting = false;
  const AllocatorStats after = allocator_stats();
  return {allocations.load(), after.requests - before.requests, after.system_allocations - before.system_allocations};
}

TEST(StepAllocation, WarmedUpTrainingStepAllocatesNothing) {
  for (const std::string name : {"cpu", "reference"}) {
    SCOPED_TRACE(name);
    Handle<Backend> backend = make_backend(name);
    NaiveAttention attention;
    TinyModel model({});
    Tape tape;
    Ops ops(*backend, &tape);
    run_steps(model, ops, tape, attention, 0, 3, false);  // warm-up: fills every cache
    const StepCounts c = run_steps(model, ops, tape, attention, 3, 3, true);
    std::printf("[ %s ] per warmed-up step: %ld system allocations, %llu tensor requests, %llu allocator misses\n",
                name.c_str(), c.mallocs / 3, static_cast<unsigned long long>(c.requests / 3),
                static_cast<unsigned long long>(c.system_allocations / 3));
    EXPECT_GT(c.requests, 0u);
    EXPECT_EQ(c.system_allocations, 0u) << "tensor allocator misses in warmed-up steps";
    EXPECT_EQ(c.mallocs, 0) << "malloc/new calls in warmed-up steps";
  }
}

TEST(StepAllocation, ATapePerStepAllocatesNothing) {
  // The natural training loop makes its tape inside the step.
  Handle<Backend> backend = make_backend("cpu");
  NaiveAttention attention;
  TinyModel model({});
  auto step = [&](std::uint64_t s) {
    Tape tape;
    Ops ops(*backend, &tape);
    ops.set_dropout_seed(3, s);
    auto [tokens, targets] = model.batch(s);
    tape.backward(model.loss(ops, attention, tokens, targets));
    for (Parameter& p : model.parameters()) p.zero_grad();
  };
  for (std::uint64_t s = 0; s < 3; ++s) step(s);
  allocations = 0;
  counting = true;
  for (std::uint64_t s = 3; s < 5; ++s) step(s);
  counting = false;
  EXPECT_EQ(allocations.load(), 0);
}

TEST(StepAllocation, EvaluationWithoutTapeAllocatesNothing) {
  Handle<Backend> backend = make_backend("cpu");
  NaiveAttention attention;
  TinyModel model({});
  Ops ops(*backend);
  ops.set_training(false);
  auto evaluate = [&](std::uint64_t step) {
    auto [tokens, targets] = model.batch(step);
    return model.loss(ops, attention, tokens, targets).item();
  };
  evaluate(0);
  evaluate(1);
  allocations = 0;
  counting = true;
  const float loss = evaluate(2);
  counting = false;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(allocations.load(), 0);
}

}  // namespace
}  // namespace loom::test
