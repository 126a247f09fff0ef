// backend/cuda: the per-element arithmetic of the kernels, as LOOM_HOST_DEVICE inline functions:
// the GPU kernels (the .cu files) call them per element, and tests/backend_cuda_math_test.cpp
// compiles this header with g++ and checks every function against the `reference` backend's
// kernels on the host (the part of the backend a machine without a GPU can test). The formulas
// are reference's, in float64, element for element, so that the GPU's results are within float32
// rounding of the oracle by construction; the reductions around them (kernels' block sums in a
// fixed tree order) are in the .cu files.
#pragma once

#include <cmath>
#include <cstdint>
#include <loom/host_device.hpp>

namespace loom::cuda::math {

// Activation codes as loom::Activation's values (kinds/backend.hpp), without its header.
enum : int { act_none = 0, act_gelu_tanh = 1, act_silu = 2 };

inline constexpr double sqrt_2_over_pi = 0.7978845608028654;
inline constexpr double gelu_coeff = 0.044715;

LOOM_HOST_DEVICE inline double act_value(int act, double x) {
  if (act == act_gelu_tanh) return 0.5 * x * (1.0 + std::tanh(sqrt_2_over_pi * (x + gelu_coeff * x * x * x)));
  if (act == act_silu) return x / (1.0 + std::exp(-x));
  return x;
}

LOOM_HOST_DEVICE inline double act_derivative(int act, double x) {
  if (act == act_gelu_tanh) {
    const double t = std::tanh(sqrt_2_over_pi * (x + gelu_coeff * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * sqrt_2_over_pi * (1.0 + 3.0 * gelu_coeff * x * x);
  }
  if (act == act_silu) {
    const double s = 1.0 / (1.0 + std::exp(-x));
    return s * (1.0 + x * (1.0 - s));
  }
  return 1.0;
}

// y (+)= v, rounded once to float.
LOOM_HOST_DEVICE inline void store(float* y, std::int64_t i, double v, bool accumulate) {
  y[i] = accumulate ? static_cast<float>(static_cast<double>(y[i]) + v) : static_cast<float>(v);
}

// swiglu: y = silu(g) u; dgate = dy u silu'(g); dup = dy silu(g).
LOOM_HOST_DEVICE inline double swiglu_value(double g, double u) {
  return act_value(act_silu, g) * u;
}
LOOM_HOST_DEVICE inline double swiglu_dgate(double g, double u, double dy) {
  return dy * u * act_derivative(act_silu, g);
}
LOOM_HOST_DEVICE inline double swiglu_dup(double g, double dy) {
  return dy * act_value(act_silu, g);
}

// Soft-capping: h = tanh(x / cap); y = cap h; the backward's 1 - t^2 with t = h h_scale.
LOOM_HOST_DEVICE inline double softcap_tanh(float x, float cap) {
  return std::tanh(static_cast<double>(x) / cap);
}
LOOM_HOST_DEVICE inline double softcap_grad(float h, float h_scale, float dy) {
  const double t = static_cast<double>(h) * h_scale;
  return static_cast<double>(dy) * (1.0 - t * t);
}

// One rotary pair: (a, b) -> (a c - b s, a s + b c), s negated for the inverse.
LOOM_HOST_DEVICE inline void rope_pair(double a, double b, double c, double s, double& ya, double& yb) {
  ya = a * c - b * s;
  yb = a * s + b * c;
}

// Dropout of one element: kept x * scale, else 0 (the product rounded in float, as reference).
LOOM_HOST_DEVICE inline double dropout_value(float x, bool keep, float scale) {
  return keep ? static_cast<double>(x * scale) : 0.0;
}

// ---- fill_normal's bits. random_normal (random.hpp) is one source for host and GPU, but its
// std::log and std::cos are the platform's: CUDA's double log is within 1 ulp, cos within 2;
// glibc's within about 1/2. The double values of the two therefore differ by a few ulps of double
// at most (far less than 2^-47 relative), and they round to the same float unless the value lies
// within that distance of a midpoint between two floats. near_float_boundary says when it does:
// the GPU kernel lists those indices (about one value in 2^22) and the backend recomputes them on
// the host, so that every value is the host's.
LOOM_HOST_DEVICE inline bool near_float_boundary(double wide) {
  const float f = static_cast<float>(wide);
  const double a = fabs(wide);
  if (a == 0.0 || !(fabs(static_cast<double>(f)) <= 3.4028234663852886e38)) return true;  // zero, inf, NaN
  const double fd = f;
  const double up = nextafterf(f, INFINITY), down = nextafterf(f, -INFINITY);
  const double tolerance = a * 0x1p-47;
  return fabs(wide - 0.5 * (fd + up)) <= tolerance || fabs(wide - 0.5 * (fd + down)) <= tolerance;
}

// ---- The router's choice: std::partial_sort(order, order + k, order + experts, better) as
// libstdc++ implements it (heap select, then sort_heap), step for step, so that a token's
// choices, NaN logits included, are exactly the host's (Backend::route_top_k's default).
struct TopKOrder {
  const float* row;
  LOOM_HOST_DEVICE bool operator()(std::int32_t a, std::int32_t b) const {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  }
};

// libstdc++'s __adjust_heap with __push_heap.
LOOM_HOST_DEVICE inline void adjust_heap(std::int32_t* first, std::int64_t hole, std::int64_t len, std::int32_t value,
                                         const TopKOrder& comp) {
  const std::int64_t top = hole;
  std::int64_t second = hole;
  while (second < (len - 1) / 2) {
    second = 2 * (second + 1);
    if (comp(first[second], first[second - 1])) second--;
    first[hole] = first[second];
    hole = second;
  }
  if ((len & 1) == 0 && second == (len - 2) / 2) {
    second = 2 * (second + 1);
    first[hole] = first[second - 1];
    hole = second - 1;
  }
  std::int64_t parent = (hole - 1) / 2;
  while (hole > top && comp(first[parent], value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

LOOM_HOST_DEVICE inline void make_heap(std::int32_t* first, std::int64_t len, const TopKOrder& comp) {
  if (len < 2) return;
  std::int64_t parent = (len - 2) / 2;
  while (true) {
    adjust_heap(first, parent, len, first[parent], comp);
    if (parent == 0) return;
    parent--;
  }
}

// libstdc++'s __pop_heap(first, last, result): *result goes into the heap, the top out to it.
LOOM_HOST_DEVICE inline void pop_heap(std::int32_t* first, std::int64_t len, std::int32_t* result,
                                      const TopKOrder& comp) {
  const std::int32_t value = *result;
  *result = first[0];
  adjust_heap(first, 0, len, value, comp);
}

// order[0, experts) holds 0..experts-1; afterwards order[0, k) are the k best, best first.
LOOM_HOST_DEVICE inline void partial_sort(std::int32_t* order, std::int64_t k, std::int64_t experts,
                                          const TopKOrder& comp) {
  // __heap_select
  make_heap(order, k, comp);
  for (std::int64_t i = k; i < experts; ++i)
    if (comp(order[i], order[0])) pop_heap(order, k, order + i, comp);
  // __sort_heap
  for (std::int64_t last = k; last > 1; --last) pop_heap(order, last - 1, order + last - 1, comp);
}

}  // namespace loom::cuda::math
