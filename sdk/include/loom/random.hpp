// Counter-based random numbers: a value is a pure function of (key, index).
//
// Device code calls these functions too (LOOM_HOST_DEVICE): a GPU backend's dropout and
// fill_normal kernels run this source. Everything but random_normal's std::log and std::cos is
// exact integer or IEEE arithmetic (the same bits everywhere); see plugins/backend/cuda for how
// its fill_normal still gives the host's bits.
//
// Nothing here has state, so the same key and index give the same number on every backend, in
// every thread, in any order: dropout masks are recomputed in the backward pass instead of
// stored, and are identical whatever the thread count. Streams are separated by key: derive a
// key per purpose with stream_key (initialisation, data order, dropout) and per use from a
// counter (the n-th dropout call of step s).
#pragma once

#include <cmath>
#include <cstdint>

#include "loom/host_device.hpp"

namespace loom {

// A bijective 32-bit mixer with good avalanche (Chris Wellons' lowbias32).
LOOM_HOST_DEVICE constexpr std::uint32_t hash_u32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// SplitMix64's finaliser.
LOOM_HOST_DEVICE constexpr std::uint64_t hash_u64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// The key of stream `stream` (any tag: 1 = init, 2 = data, 3 = dropout, ...) for `seed`, used
// for the `counter`-th time (the step, or the n-th call within a step).
LOOM_HOST_DEVICE constexpr std::uint64_t stream_key(std::uint64_t seed, std::uint64_t stream, std::uint64_t counter) {
  return hash_u64(hash_u64(hash_u64(seed) ^ stream) + counter);
}

// 32 random bits for element `index` (< 2^32) of the draw keyed by `key`.
LOOM_HOST_DEVICE constexpr std::uint32_t random_bits(std::uint64_t key, std::uint32_t index) {
  return hash_u32(index ^ static_cast<std::uint32_t>(key)) ^ static_cast<std::uint32_t>(key >> 32);
}

// Uniform in [0, 1), 24 bits.
LOOM_HOST_DEVICE inline float random_uniform(std::uint64_t key, std::uint32_t index) {
  return static_cast<float>(random_bits(key, index) >> 8) * (1.0f / 16777216.0f);
}

// Standard normal (Box-Muller on two uniforms drawn at 2*index and 2*index+1), in double before
// random_normal rounds it to float.
LOOM_HOST_DEVICE inline double random_normal_wide(std::uint64_t key, std::uint32_t index) {
  const double u1 = (static_cast<double>(random_bits(key, 2 * index) >> 8) + 1.0) * (1.0 / 16777217.0);
  const double u2 = static_cast<double>(random_bits(key, 2 * index + 1) >> 8) * (1.0 / 16777216.0);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}
LOOM_HOST_DEVICE inline float random_normal(std::uint64_t key, std::uint32_t index) {
  return static_cast<float>(random_normal_wide(key, index));
}

// Dropout: element i is kept when random_bits(key, i) >= dropout_threshold(p), and a kept
// element is multiplied by dropout_scale(p). Every backend must use exactly these three
// functions so that masks and values agree bit for bit.
LOOM_HOST_DEVICE constexpr std::uint32_t dropout_threshold(float p) {
  return p <= 0.0f ? 0u : p >= 1.0f ? 0xffffffffu : static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
}
LOOM_HOST_DEVICE constexpr float dropout_scale(float p) {
  return p >= 1.0f ? 0.0f : 1.0f / (1.0f - p);
}
LOOM_HOST_DEVICE constexpr bool dropout_keep(std::uint64_t key, std::uint32_t index, std::uint32_t threshold) {
  return random_bits(key, index) >= threshold;
}

}  // namespace loom
