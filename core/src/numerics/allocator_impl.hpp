// Core-internal entry point of the caching allocator (allocator.cpp).
#pragma once

#include <cstddef>

#include "loom/tensor.hpp"

namespace loom::detail {

// A block of at least `bytes` bytes, 64-byte aligned, with one reference held by the caller.
Storage* allocate_storage(std::size_t bytes);

}  // namespace loom::detail
