// The arithmetic of the training step's kernels around the model (backend.hpp, "Training step"):
// the elementwise optimizer updates and the gradient norm's sum of squares, written once so that
// every place that computes them gives the same bits:
//   * the optimizer plugins (adamw, sgd, lion) run apply_elementwise_update on host memory, chunk
//     by chunk on the pool (ElementwiseOptimizer::update_chunk);
//   * Backend's host fallback of the `optimizer` kernel group (used by `reference`, and so by the
//     `guarded` test device) runs the same function over a whole parameter;
//   * the trainer's gradient norm sums squares with sum_of_squares per chunk on host memory, and
//     Backend's fallback of the `sum_of_squares` kernel does the same per chunk.
// A translation unit that instantiates apply_elementwise_update must be compiled with
// -ffp-contract=off -fno-math-errno (as the optimizer plugins and the core's fallback are): the
// roundings are the ones written, the fused multiply-adds the std::fma calls, nothing the compiler
// chooses. Each rule's arithmetic on one element is a LOOM_HOST_DEVICE function that the host
// loops call and a GPU kernel calls per element (plugins/backend/cuda, compiled with nvcc's
// -fmad=false, the same promise): one source of roundings for both.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "loom/host_device.hpp"

namespace loom {

// The elementwise update rules a backend implements (BackendOp::optimizer). Each is the rule of
// one optimizer plugin, with that plugin's order of operations.
enum class UpdateRule : std::uint8_t {
  adamw,  // torch.optim.AdamW: slots[0] exp_avg, slots[1] exp_avg_sq
  sgd,    // torch.optim.SGD (momentum, dampening, Nesterov, L2 decay): slots[0] momentum_buffer
  lion,   // Lion (Chen et al., 2023): slots[0] exp_avg
};

// One parameter's update in one step: the rule, its per-step constants (rounded to float once,
// as PyTorch rounds its Python scalars) and its per-parameter switches. Fields a rule does not
// read are ignored.
struct ElementwiseUpdate {
  UpdateRule rule = UpdateRule::sgd;
  bool decay = false;  // the parameter's weight decay applies (mask and a non-zero weight_decay)
  // adamw: p <- p * decay_factor; m, v moments; p <- p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
  float decay_factor = 1.0f;  // 1 - lr * weight_decay
  float beta1 = 0.0f, one_minus_beta1 = 0.0f;
  float beta2 = 0.0f, one_minus_beta2 = 0.0f;
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float epsilon = 0.0f;
  float step_size = 0.0f;  // lr / (1 - beta1^t)
  // sgd and lion
  float lr = 0.0f;
  float weight_decay = 0.0f;  // sgd: L2 added to the gradient; lion: decoupled (both 0 if !decay)
  // sgd
  bool momentum = false;  // momentum != 0 (the parameter then has a momentum buffer)
  bool first = false;     // the parameter's first update: the buffer starts at the gradient
  bool nesterov = false;
  float momentum_factor = 0.0f;
  float one_minus_dampening = 1.0f;
};

namespace update_rules {

// AdamW in torch.optim.AdamW's order of operations:
//   p <- p * (1 - lr wd)                                   (only for decayed parameters)
//   m <- beta1 m + (1 - beta1) g
//   v <- beta2 v + (1 - beta2) g^2
//   p <- p - step_size * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// The one fused multiply-add is where PyTorch's vectorised add(alpha) has one too.
template <bool kDecay>
LOOM_HOST_DEVICE inline void adamw_element(float& p, float g, float& m, float& v, float decay, float b1, float c1,
                                           float b2, float c2, float bc2_sqrt, float eps, float neg_step_size) {
  float pi = p;
  if constexpr (kDecay) pi *= decay;
  const float mi = std::fma(g, c1, m * b1);
  const float vi = v * b2 + (c2 * g) * g;
  m = mi;
  v = vi;
  p = pi + neg_step_size * (mi / (std::sqrt(vi) / bc2_sqrt + eps));
}

template <bool kDecay>
inline void adamw(float* __restrict p, const float* __restrict g, float* __restrict m, float* __restrict v,
                  std::int64_t n, const ElementwiseUpdate& s) {
  const float decay = s.decay_factor, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2, c2 = s.one_minus_beta2;
  const float bc2_sqrt = s.bias_correction2_sqrt, eps = s.epsilon, neg_step_size = -s.step_size;
  for (std::int64_t i = 0; i < n; ++i)
    adamw_element<kDecay>(p[i], g[i], m[i], v[i], decay, b1, c1, b2, c2, bc2_sqrt, eps, neg_step_size);
}

// SGD: d = g (+ wd p); with momentum, buf = d on a parameter's first update (PyTorch starts the
// buffer at the first gradient, undamped) and buf = momentum buf + (1 - dampening) d after it;
// the direction is buf, or d + momentum buf for Nesterov; finally p -= lr * direction. Each
// a + alpha * b is one fused multiply-add, as in PyTorch's vectorised add(alpha).
template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
LOOM_HOST_DEVICE inline void sgd_element(float& p, float g, float* buf, float neg_lr, float wd, float mu, float damp) {
  const float pi = p;
  float d = g;
  if constexpr (kDecay) d = std::fma(pi, wd, d);
  if constexpr (kMomentum) {
    float b;
    if constexpr (kFirst)
      b = d;
    else
      b = std::fma(d, damp, *buf * mu);
    *buf = b;
    if constexpr (kNesterov)
      d = std::fma(b, mu, d);
    else
      d = b;
  }
  p = std::fma(d, neg_lr, pi);
}

template <bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
inline void sgd(float* __restrict p, const float* __restrict g, float* __restrict buf, std::int64_t n,
                const ElementwiseUpdate& s) {
  const float neg_lr = -s.lr, wd = s.weight_decay, mu = s.momentum_factor, damp = s.one_minus_dampening;
  for (std::int64_t i = 0; i < n; ++i)
    sgd_element<kDecay, kMomentum, kFirst, kNesterov>(p[i], g[i], kMomentum ? buf + i : nullptr, neg_lr, wd, mu, damp);
}

template <bool kDecay>
inline void sgd_dispatch(float* p, const float* g, float* buf, std::int64_t n, const ElementwiseUpdate& s) {
  if (!s.momentum) return sgd<kDecay, false, false, false>(p, g, buf, n, s);
  if (s.first)
    return s.nesterov ? sgd<kDecay, true, true, true>(p, g, buf, n, s)
                      : sgd<kDecay, true, true, false>(p, g, buf, n, s);
  return s.nesterov ? sgd<kDecay, true, false, true>(p, g, buf, n, s)
                    : sgd<kDecay, true, false, false>(p, g, buf, n, s);
}

// Lion, the paper's expressions as written (each operation rounded once); the momentum update is
// one fused multiply-add, as PyTorch's add(alpha):
//   c = beta1 m + (1 - beta1) g;  p = p - lr (sign(c) + wd p);  m = beta2 m + (1 - beta2) g
template <bool kDecay>
LOOM_HOST_DEVICE inline void lion_element(float& p, float g, float& m, float lr, float wd, float b1, float c1, float b2,
                                          float c2) {
  const float pi = p, gi = g, mi = m;
  const float c = b1 * mi + c1 * gi;
  // sign(0) = 0, as in the paper's (and PyTorch's) sign.
  float update = static_cast<float>(c > 0.0f) - static_cast<float>(c < 0.0f);
  if constexpr (kDecay) update = update + wd * pi;
  p = pi - lr * update;
  m = std::fma(gi, c2, mi * b2);
}

template <bool kDecay>
inline void lion(float* __restrict p, const float* __restrict g, float* __restrict m, std::int64_t n,
                 const ElementwiseUpdate& s) {
  const float lr = s.lr, wd = s.weight_decay, b1 = s.beta1, c1 = s.one_minus_beta1, b2 = s.beta2,
              c2 = s.one_minus_beta2;
  for (std::int64_t i = 0; i < n; ++i) lion_element<kDecay>(p[i], g[i], m[i], lr, wd, b1, c1, b2, c2);
}

}  // namespace update_rules

// Updates n elements of a parameter, its gradient and its slots (as the rule names them; the
// others unused) in place, on memory the calling code can read: the host arithmetic of
// BackendOp::optimizer.
inline void apply_elementwise_update(const ElementwiseUpdate& u, float* parameter, const float* grad,
                                     const std::array<float*, 4>& slots, std::int64_t n) {
  // Each rule's loop instantiated for the decay switch (a compile-time constant in the loop).
  const auto with_decay = [&](auto pass) {
    if (u.decay)
      pass(std::true_type{});
    else
      pass(std::false_type{});
  };
  switch (u.rule) {
    case UpdateRule::adamw:
      return with_decay(
          [&](auto d) { update_rules::adamw<decltype(d)::value>(parameter, grad, slots[0], slots[1], n, u); });
    case UpdateRule::sgd:
      return with_decay(
          [&](auto d) { update_rules::sgd_dispatch<decltype(d)::value>(parameter, grad, slots[0], n, u); });
    case UpdateRule::lion:
      return with_decay([&](auto d) { update_rules::lion<decltype(d)::value>(parameter, grad, slots[0], n, u); });
  }
}

// The sum of d[i]^2 in double over one chunk of a gradient: eight running sums (lane j takes
// i = j mod 8, which the compiler keeps in one vector register), combined pairwise at the end.
// The gradient norm sums these per chunk of a fixed size and adds the chunks in order, so its
// bits do not depend on the thread count or the backend.
LOOM_HOST_DEVICE inline double sum_of_squares(const float* d, std::int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += static_cast<double>(d[i + j]) * d[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += static_cast<double>(d[i]) * d[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

}  // namespace loom
