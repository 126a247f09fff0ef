// CPython's random.Random, for the harness's draws that loom replays (evaluate.cpp, tasks.cpp).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

namespace loom::eval {

// CPython's random.Random (3.11): MT19937 seeded as Random(seed) seeds it (init_by_array over the
// seed's 32-bit words), random() from two draws, and sample() as Lib/random.py draws it. The
// harness's bootstrap resamples with random(), its few-shot sampler picks examples with sample().
class PythonRandom {
 public:
  explicit PythonRandom(std::uint32_t seed) {
    mt_[0] = 19650218u;
    for (std::uint32_t i = 1; i < kN; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
    std::uint32_t i = 1;
    for (std::uint32_t k = kN; k; --k) {  // one key word: the seed
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + seed;
      if (++i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
    }
    for (std::uint32_t k = kN - 1; k; --k) {
      mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - i;
      if (++i >= kN) {
        mt_[0] = mt_[kN - 1];
        i = 1;
      }
    }
    mt_[0] = 0x80000000u;
  }
  double random() {
    const std::uint32_t a = next() >> 5, b = next() >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
  }
  // getrandbits(k) for 0 < k <= 32.
  std::uint32_t getrandbits(int k) { return next() >> (32 - k); }
  // _randbelow_with_getrandbits: k = n.bit_length() bits, redrawn until below n (n > 0, < 2^32).
  std::uint64_t randbelow(std::uint64_t n) {
    const int k = static_cast<int>(std::bit_width(n));
    std::uint64_t r = getrandbits(k);
    while (r >= n) r = getrandbits(k);
    return r;
  }
  // The indices random.sample(range(n), k) returns, in its order: a pool of n when it is smaller
  // than a set of k would be, else draws rejected while already selected. k <= n.
  std::vector<std::size_t> sample(std::size_t n, std::size_t k) {
    std::vector<std::size_t> result(k);
    std::size_t setsize = 21;
    if (k > 5)
      setsize +=
          static_cast<std::size_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k * 3)) / std::log(4.0))));
    if (n <= setsize) {
      std::vector<std::size_t> pool(n);
      for (std::size_t i = 0; i < n; ++i) pool[i] = i;
      for (std::size_t i = 0; i < k; ++i) {
        const std::size_t j = randbelow(n - i);
        result[i] = pool[j];
        pool[j] = pool[n - i - 1];
      }
    } else {
      std::set<std::size_t> selected;
      for (std::size_t i = 0; i < k; ++i) {
        std::size_t j = randbelow(n);
        while (selected.count(j)) j = randbelow(n);
        selected.insert(j);
        result[i] = j;
      }
    }
    return result;
  }

 private:
  static constexpr std::uint32_t kN = 624, kM = 397;
  std::uint32_t next() {
    if (index_ >= kN) {
      for (std::uint32_t k = 0; k < kN; ++k) {
        const std::uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % kN] & 0x7fffffffu);
        mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
      }
      index_ = 0;
    }
    std::uint32_t y = mt_[index_++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
  }
  std::uint32_t mt_[kN];
  std::uint32_t index_ = kN;
};

}  // namespace loom::eval
