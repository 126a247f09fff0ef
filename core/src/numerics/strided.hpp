// Core-internal: walking strided tensors row by row.
#pragma once

#include <array>
#include <cstdint>

#include "loom/tensor.hpp"

namespace loom::detail {

// Calls run(offset in a, offset in b, length) for every row (run of the last dimension) of two
// tensors of one shape with strides `sa` and `sb`, offsets relative to element [0, ...], rows in
// row-major order. A scalar is one row of length 1.
template <class F>
void for_each_row_pair(const Shape& shape, const Strides& sa, const Strides& sb, F&& run) {
  const int rank = shape.rank();
  if (shape.numel() == 0) return;
  if (rank == 0) {
    run(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
    return;
  }
  std::array<std::int64_t, max_rank> index{};
  const std::int64_t rows = shape.numel() / shape.back();
  std::int64_t oa = 0, ob = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    run(oa, ob, shape.back());
    for (int d = rank - 2; d >= 0; --d) {
      const auto u = static_cast<std::size_t>(d);
      if (++index[u] < shape[d]) {
        oa += sa[u];
        ob += sb[u];
        break;
      }
      oa -= (index[u] - 1) * sa[u];
      ob -= (index[u] - 1) * sb[u];
      index[u] = 0;
    }
  }
}

}  // namespace loom::detail
