// A batch cut into micro-batches: the rows one forward pass takes, as tensors. Training
// accumulates gradients over them; evaluation sums their losses.
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "loom/kinds/dataset.hpp"
#include "loom/tensor.hpp"

namespace loom::training {

struct MicroBatch {
  std::int64_t index = 0;    // position in the batch: the micro-batch's dropout stream
  std::int64_t counted = 0;  // targets that count toward the loss
  Tensor tokens, targets;    // [rows, seq_len]
  Tensor segments;           // [rows, seq_len], or empty when the batch has no segment ids
};

// Targets that count toward the loss (every one but -1).
std::int64_t count_targets(std::span<const std::int32_t> targets);

// Calls `fn` with each micro-batch of `batch` in order: rows [m * micro_size, (m + 1) *
// micro_size), the last one shorter when micro_size does not divide the batch size. A micro-batch
// without a counted target is skipped: its loss is undefined and would add nothing.
// `first_row` and `row_count` (-1: to the end) restrict it to a data-parallel rank's rows;
// first_row is a multiple of micro_size, and micro-batches keep their index in the whole batch.
void for_each_micro_batch(const Batch& batch, std::int64_t micro_size, const std::function<void(const MicroBatch&)>& fn,
                          std::int64_t first_row = 0, std::int64_t row_count = -1);

}  // namespace loom::training
