// Backend's host fallbacks of the training step's kernels that need no special rounding rules:
// parameter initialisation and the gradient norm's sums of squares (backend.hpp, "Training step").
// Compiled with the trainer's flags, so that sum_of_squares gives the trainer's host bits.
#include <algorithm>

#include "loom/kinds/backend.hpp"
#include "loom/random.hpp"
#include "loom/training_kernels.hpp"

namespace loom {

void Backend::fill_normal(float* y, std::int64_t n, std::uint64_t key, std::int64_t first_index, float scale) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = scale * random_normal(key, static_cast<std::uint32_t>(first_index + i));
}

void Backend::sum_of_squares(const float* x, std::int64_t n, std::int64_t chunk, double* partials) {
  for (std::int64_t begin = 0, c = 0; begin < n; begin += chunk, ++c)
    partials[c] = loom::sum_of_squares(x + begin, std::min(chunk, n - begin));
}

}  // namespace loom
