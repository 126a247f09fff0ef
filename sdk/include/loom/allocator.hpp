// The core's tensor allocator: a caching allocator that reuses buffers between steps.
//
// Every Tensor's memory comes from here. A request is rounded up to a size class (at most 1/16
// above the request, 64-byte aligned; blocks of 4 MiB and more are 2 MiB aligned and advised as
// huge pages); a block whose last Tensor is released goes back to its class's free list, and the
// next request of that class takes it from there. Since a training step allocates the same
// shapes in the same order as the step before, a warmed-up step is served entirely from the
// cache: `system_allocations` stops growing. The cache is the "arena per step" of the design,
// with buffers freed as soon as the autograd tape no longer needs them rather than at the end of
// the step, so peak memory is the live set, not the sum.
//
// Thread-safe (one mutex, held for a few dozen instructions per request).
#pragma once

#include <cstddef>
#include <cstdint>

namespace loom {

struct AllocatorStats {
  std::uint64_t requests = 0;            // blocks asked for
  std::uint64_t cache_hits = 0;          // requests served from the cache
  std::uint64_t system_allocations = 0;  // requests that called the system allocator (misses)
  std::uint64_t releases = 0;            // blocks given back by their last tensor
  std::size_t bytes_in_use = 0;          // in blocks some tensor refers to (rounded sizes)
  std::size_t peak_bytes_in_use = 0;
  std::size_t bytes_cached = 0;  // in free blocks kept for reuse
};

AllocatorStats allocator_stats();

// Returns every cached (unused) block to the system. Blocks in use are unaffected.
void allocator_release_cached();

// Resets peak_bytes_in_use to the current bytes_in_use (for measuring one phase).
void allocator_reset_peak();

}  // namespace loom
