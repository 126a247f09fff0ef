// backend/cuda: the training step's kernels around the model (kinds/backend.hpp, "Training
// step"): parameter initialisation, the elementwise optimizer updates and the gradient norm's
// sums of squares, each running the host's own source (random.hpp, training_kernels.hpp: the
// LOOM_HOST_DEVICE functions) per element or per chunk. Compiled with -fmad=false (CMakeLists.txt):
// no multiply-add the source does not write, as the host's -ffp-contract=off.
#include <cfloat>
#include <loom/random.hpp>
#include <loom/training_kernels.hpp>

#include "common.cuh"
#include "kernels.hpp"

namespace loom::cuda {

namespace {

__global__ void fill_normal_kernel(float* y, std::int64_t n, std::uint64_t key, std::int64_t first, float scale,
                                   std::uint32_t* uncertain, std::uint32_t* uncertain_count, std::uint32_t capacity) {
  LOOM_GRID_STRIDE(i, n) {
    const double wide = random_normal_wide(key, static_cast<std::uint32_t>(first + i));
    y[i] = scale * static_cast<float>(wide);
    if (math::near_float_boundary(wide)) {
      const std::uint32_t slot = atomicAdd(uncertain_count, 1u);
      if (slot < capacity) uncertain[slot] = static_cast<std::uint32_t>(i);
    }
  }
}

template <bool kDecay>
__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, std::int64_t n, ElementwiseUpdate s) {
  const float neg_step_size = -s.step_size;
  LOOM_GRID_STRIDE(i, n)
  update_rules::adamw_element<kDecay>(p[i], g[i], m[i], v[i], s.decay_factor, s.beta1, s.one_minus_beta1, s.beta2,
                                      s.one_minus_beta2, s.bias_correction2_sqrt, s.epsilon, neg_step_size);
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
__global__ void sgd_kernel(float* p, const float* g, float* buf, std::int64_t n, ElementwiseUpdate s) {
  const float neg_lr = -s.lr;
  LOOM_GRID_STRIDE(i, n)
  update_rules::sgd_element<kDecay, kMomentum, kFirst, kNesterov>(
      p[i], g[i], kMomentum ? buf + i : nullptr, neg_lr, s.weight_decay, s.momentum_factor, s.one_minus_dampening);
}

template <bool kDecay>
__global__ void lion_kernel(float* p, const float* g, float* m, std::int64_t n, ElementwiseUpdate s) {
  LOOM_GRID_STRIDE(i, n)
  update_rules::lion_element<kDecay>(p[i], g[i], m[i], s.lr, s.weight_decay, s.beta1, s.one_minus_beta1, s.beta2,
                                     s.one_minus_beta2);
}

// One thread per chunk: loom::sum_of_squares itself (eight lanes, combined pairwise).
__global__ void sum_of_squares_kernel(const float* x, std::int64_t n, std::int64_t chunk, double* partials) {
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  LOOM_GRID_STRIDE(c, chunks) {
    const std::int64_t begin = c * chunk;
    partials[c] = loom::sum_of_squares(x + begin, n - begin < chunk ? n - begin : chunk);
  }
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd(cudaStream_t st, float* p, const float* g, float* buf, std::int64_t n, const ElementwiseUpdate& s) {
  sgd_kernel<kDecay, kMomentum, kFirst, kNesterov><<<blocks_for(n, kThreads), kThreads, 0, st>>>(p, g, buf, n, s);
}

template <bool kDecay>
void sgd_dispatch(cudaStream_t st, float* p, const float* g, float* buf, std::int64_t n, const ElementwiseUpdate& s) {
  if (!s.momentum) return sgd<kDecay, false, false, false>(st, p, g, buf, n, s);
  if (s.first)
    return s.nesterov ? sgd<kDecay, true, true, true>(st, p, g, buf, n, s)
                      : sgd<kDecay, true, true, false>(st, p, g, buf, n, s);
  return s.nesterov ? sgd<kDecay, true, false, true>(st, p, g, buf, n, s)
                    : sgd<kDecay, true, false, false>(st, p, g, buf, n, s);
}

}  // namespace

void launch_fill_normal(cudaStream_t s, float* y, int64_t n, std::uint64_t key, int64_t first_index, float scale,
                        std::uint32_t* uncertain, std::uint32_t* uncertain_count, std::uint32_t capacity) {
  if (n <= 0) return;
  fill_normal_kernel<<<blocks_for(n, kThreads), kThreads, 0, s>>>(y, n, key, first_index, scale, uncertain,
                                                                  uncertain_count, capacity);
  LOOM_CHECK_LAUNCH("fill_normal");
}

void launch_elementwise_update(cudaStream_t st, const ElementwiseUpdate& u, float* parameter, const float* grad,
                               const std::array<float*, 4>& slots, int64_t n) {
  if (n <= 0) return;
  const unsigned blocks = blocks_for(n, kThreads);
  switch (u.rule) {
    case UpdateRule::adamw:
      if (u.decay)
        adamw_kernel<true><<<blocks, kThreads, 0, st>>>(parameter, grad, slots[0], slots[1], n, u);
      else
        adamw_kernel<false><<<blocks, kThreads, 0, st>>>(parameter, grad, slots[0], slots[1], n, u);
      break;
    case UpdateRule::sgd:
      if (u.decay)
        sgd_dispatch<true>(st, parameter, grad, slots[0], n, u);
      else
        sgd_dispatch<false>(st, parameter, grad, slots[0], n, u);
      break;
    case UpdateRule::lion:
      if (u.decay)
        lion_kernel<true><<<blocks, kThreads, 0, st>>>(parameter, grad, slots[0], n, u);
      else
        lion_kernel<false><<<blocks, kThreads, 0, st>>>(parameter, grad, slots[0], n, u);
      break;
  }
  LOOM_CHECK_LAUNCH("elementwise_update");
}

void launch_sum_of_squares(cudaStream_t s, const float* x, int64_t n, int64_t chunk, double* partials) {
  if (n <= 0) return;
  const int64_t chunks = (n + chunk - 1) / chunk;
  sum_of_squares_kernel<<<blocks_for(chunks, 64), 64, 0, s>>>(x, n, chunk, partials);
  LOOM_CHECK_LAUNCH("sum_of_squares");
}

}  // namespace loom::cuda
