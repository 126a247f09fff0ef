// backend/cuda: the mixture of experts' router (route_top_k): each token's choice by the host's
// own selection (kernel_math.hpp's port of std::partial_sort), then the per-expert counts, the
// expert-sorted token list and the output rows, each expert's tokens in token order.
#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

// One thread per token; `order` is scratch of tokens x experts ids.
__global__ void choose_kernel(const float* logits, std::int64_t tokens, std::int64_t experts, std::int64_t k,
                              std::int32_t* order, std::int32_t* chosen) {
  LOOM_GRID_STRIDE(t, tokens) {
    const float* row = logits + t * experts;
    std::int32_t* o = order + t * experts;
    for (std::int64_t e = 0; e < experts; ++e) o[e] = static_cast<std::int32_t>(e);
    math::partial_sort(o, k, experts, math::TopKOrder{row});
    for (std::int64_t j = 0; j < k; ++j) chosen[t * k + j] = static_cast<std::int32_t>(t * experts + o[j]);
  }
}

// One thread per expert: its count, then (all counts known) its tokens' places.
__global__ void count_kernel(const std::int32_t* chosen, std::int64_t tokens, std::int64_t experts, std::int64_t k,
                             std::int32_t* counts) {
  LOOM_GRID_STRIDE(e, experts) {
    std::int32_t count = 0;
    for (std::int64_t tj = 0; tj < tokens * k; ++tj)
      if (chosen[tj] - (tj / k) * experts == e) ++count;
    counts[e] = count;
  }
}

__global__ void place_kernel(const std::int32_t* chosen, const std::int32_t* counts, std::int64_t tokens,
                             std::int64_t experts, std::int64_t k, std::int64_t first, std::int64_t last,
                             std::int32_t* slots, std::int32_t* sorted) {
  LOOM_GRID_STRIDE(e, experts) {
    std::int32_t begin = 0, mine = 0, member = 0;
    for (std::int64_t f = 0; f < experts; ++f) {
      if (f < e) begin += counts[f];
      if (f >= first && f < last) {
        if (f < e) mine += counts[f];
        member += counts[f];
      }
    }
    const bool inside = e >= first && e < last;
    std::int32_t i = 0;
    for (std::int64_t tj = 0; tj < tokens * k; ++tj) {
      const std::int64_t t = tj / k;
      if (chosen[tj] - t * experts != e) continue;
      sorted[begin + i] = static_cast<std::int32_t>(t);
      slots[tj] = inside ? mine + i : member;
      ++i;
    }
  }
}

}  // namespace

void launch_route_top_k(Context& c, const float* logits, int64_t tokens, int64_t experts, int64_t k, int64_t first,
                        int64_t last, int32_t* chosen, int32_t* slots, int32_t* sorted, int32_t* counts) {
  if (experts <= 0) return;
  if (tokens <= 0) {
    LOOM_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * static_cast<std::size_t>(experts), c.stream));
    return;
  }
  Context::Scratch order(c, sizeof(int32_t) * static_cast<std::size_t>(tokens * experts));
  choose_kernel<<<blocks_for(tokens, 128), 128, 0, c.stream>>>(logits, tokens, experts, k, order.as<int32_t>(), chosen);
  LOOM_CHECK_LAUNCH("route_top_k (choose)");
  count_kernel<<<blocks_for(experts, 64), 64, 0, c.stream>>>(chosen, tokens, experts, k, counts);
  LOOM_CHECK_LAUNCH("route_top_k (count)");
  place_kernel<<<blocks_for(experts, 64), 64, 0, c.stream>>>(chosen, counts, tokens, experts, k, first, last, slots,
                                                             sorted);
  LOOM_CHECK_LAUNCH("route_top_k (place)");
}

}  // namespace loom::cuda
