// Core-only memory plumbing for the run layer's fully sharded data parallelism (FSDP): a
// parameter's value and gradient live in a unit's storage that takes memory while the unit runs
// and gives it back afterwards, while every tensor that refers to it (the model's parameters,
// the tape's saved inputs) keeps referring to the same storage. Not part of the SDK: plugins
// never see a storage change under them between two of their calls.
#pragma once

#include <cstddef>

#include "loom/autograd.hpp"
#include "loom/tensor.hpp"

namespace loom::core {

// Gives the host storage under `t` a fresh block of at least `bytes` bytes (contents undefined)
// and returns its old block to the caching allocator's cache. Every tensor over that storage
// sees the new block; their offsets and shapes are the caller's to keep inside it. An
// InternalError for a tensor that is not in the host's caching allocator.
void rebind_host_storage(const Tensor& t, std::size_t bytes);

// Makes `value` (same shape, contiguous f32) the parameter's value from now on, with the
// parameter's autograd identity; the old value's storage is no longer the parameter's. For
// moving a model's parameters into FSDP's unit storages before any step.
void rebind_parameter(Parameter& p, const Tensor& value);

}  // namespace loom::core
