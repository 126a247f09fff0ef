#include "train/micro_batches.hpp"

#include <algorithm>

namespace loom::training {

std::int64_t count_targets(std::span<const std::int32_t> targets) {
  std::int64_t counted = 0;
  for (auto t : targets) counted += t >= 0;
  return counted;
}

void for_each_micro_batch(const Batch& batch, std::int64_t micro_size, const std::function<void(const MicroBatch&)>& fn,
                          std::int64_t first_row, std::int64_t row_count) {
  const std::int64_t end_row = row_count < 0 ? batch.batch_size : std::min(batch.batch_size, first_row + row_count);
  const std::int64_t count = end_row / micro_size + (end_row % micro_size != 0);
  for (std::int64_t m = first_row / micro_size; m < count; ++m) {
    const std::int64_t rows = std::min(micro_size, end_row - m * micro_size);
    const std::size_t begin = static_cast<std::size_t>(m * micro_size * batch.seq_len);
    const std::size_t size = static_cast<std::size_t>(rows * batch.seq_len);
    const Shape shape{rows, batch.seq_len};
    MicroBatch micro;
    micro.index = m;
    micro.counted = count_targets(std::span<const std::int32_t>(batch.targets.data() + begin, size));
    if (micro.counted == 0) continue;
    micro.tokens = Tensor::from(std::span<const std::int32_t>(batch.inputs.data() + begin, size), shape);
    micro.targets = Tensor::from(std::span<const std::int32_t>(batch.targets.data() + begin, size), shape);
    if (!batch.segment_ids.empty())
      micro.segments = Tensor::from(std::span<const std::int32_t>(batch.segment_ids.data() + begin, size), shape);
    fn(micro);
  }
}

}  // namespace loom::training
