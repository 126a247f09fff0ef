// Core-internal entry point of the caching allocator (allocator.cpp).
#pragma once

#include <cstddef>

#include "loom/tensor.hpp"

namespace loom::detail {

// A block of at least `bytes` bytes, 64-byte aligned, with one reference held by the caller.
// `zeroed`: its first `bytes` bytes read zero. A block fresh from the system is zero already and
// is not written: its pages stay unallocated until first written (a model whose frozen weights
// will be stored in fewer bits never touches their float32 pages; lora.base_dtype).
Storage* allocate_storage(std::size_t bytes, bool zeroed = false);

}  // namespace loom::detail
