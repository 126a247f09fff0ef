// The NF4 and int8 codecs of sdk/include/loom/quantization.hpp. Quantization is scalar (it runs
// once per weight, at load); dequantization has AVX2 (the build baseline) and AVX-512 kernels,
// chosen at run time. Compiled with -ffp-contract=off: an FMA would change the bits of
// code * scale + offset from bitsandbytes' two roundings, and make the kernels disagree.
#include "loom/quantization.hpp"

#if defined(__x86_64__)
// GCC 12 reports its own AVX-512 intrinsics (which pass _mm512_undefined_ps() as the unused merge
// source) as "(may be) used uninitialized" once inlined: a false warning, silenced for them only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <sstream>

#include "loom/error.hpp"

namespace loom::quant {
namespace {

// bitsandbytes' functional.create_dynamic_map() (signed, 7 exponent bits, 8 bits), computed by
// its own code (torch.linspace in float32) and written out bit for bit.
constexpr std::array<float, 256> dynamic8_table = {
    -0x1.fc6666p-1f,  -0x1.f53332p-1f,  -0x1.ee0000p-1f,  -0x1.e6ccccp-1f,  -0x1.df9998p-1f,  -0x1.d86666p-1f,
    -0x1.d13334p-1f,  -0x1.ca0000p-1f,  -0x1.c2ccccp-1f,  -0x1.bb9998p-1f,  -0x1.b46666p-1f,  -0x1.ad3332p-1f,
    -0x1.a60000p-1f,  -0x1.9eccccp-1f,  -0x1.979998p-1f,  -0x1.906666p-1f,  -0x1.893334p-1f,  -0x1.820000p-1f,
    -0x1.7acccep-1f,  -0x1.73999ap-1f,  -0x1.6c6668p-1f,  -0x1.653334p-1f,  -0x1.5e0000p-1f,  -0x1.56cccep-1f,
    -0x1.4f999ap-1f,  -0x1.486666p-1f,  -0x1.413334p-1f,  -0x1.3a0000p-1f,  -0x1.32ccccp-1f,  -0x1.2b999ap-1f,
    -0x1.246668p-1f,  -0x1.1d3334p-1f,  -0x1.160000p-1f,  -0x1.0eccccp-1f,  -0x1.07999ap-1f,  -0x1.006666p-1f,
    -0x1.f26668p-2f,  -0x1.e40000p-2f,  -0x1.d59998p-2f,  -0x1.c73334p-2f,  -0x1.b8ccccp-2f,  -0x1.aa6664p-2f,
    -0x1.9c0000p-2f,  -0x1.8d9998p-2f,  -0x1.7f3334p-2f,  -0x1.70ccccp-2f,  -0x1.626664p-2f,  -0x1.540000p-2f,
    -0x1.459998p-2f,  -0x1.373334p-2f,  -0x1.28ccccp-2f,  -0x1.1a6668p-2f,  -0x1.0c0000p-2f,  -0x1.fb3334p-3f,
    -0x1.de6668p-3f,  -0x1.c1999ap-3f,  -0x1.a4ccccp-3f,  -0x1.880000p-3f,  -0x1.6b3332p-3f,  -0x1.4e6666p-3f,
    -0x1.31999ap-3f,  -0x1.14ccccp-3f,  -0x1.f00000p-4f,  -0x1.b66668p-4f,  -0x1.93d70ap-4f,  -0x1.8851eap-4f,
    -0x1.7ccccep-4f,  -0x1.7147aep-4f,  -0x1.65c290p-4f,  -0x1.5a3d70p-4f,  -0x1.4eb850p-4f,  -0x1.433334p-4f,
    -0x1.37ae14p-4f,  -0x1.2c28f6p-4f,  -0x1.20a3d6p-4f,  -0x1.151ebap-4f,  -0x1.09999ap-4f,  -0x1.fc28f4p-5f,
    -0x1.e51ebap-5f,  -0x1.ce147ap-5f,  -0x1.b70a3ep-5f,  -0x1.a00000p-5f,  -0x1.88f5c2p-5f,  -0x1.71eb86p-5f,
    -0x1.5ae146p-5f,  -0x1.43d70ap-5f,  -0x1.2ccccep-5f,  -0x1.15c28ep-5f,  -0x1.fd70a4p-6f,  -0x1.cf5c26p-6f,
    -0x1.a147aep-6f,  -0x1.733334p-6f,  -0x1.451eb8p-6f,  -0x1.170a3ep-6f,  -0x1.d1eb86p-7f,  -0x1.75c290p-7f,
    -0x1.3e76c8p-7f,  -0x1.2c0830p-7f,  -0x1.19999ap-7f,  -0x1.072b02p-7f,  -0x1.e978d4p-8f,  -0x1.c49ba6p-8f,
    -0x1.9fbe76p-8f,  -0x1.7ae148p-8f,  -0x1.56041ap-8f,  -0x1.3126e8p-8f,  -0x1.0c49bap-8f,  -0x1.ced914p-9f,
    -0x1.851eb8p-9f,  -0x1.3b645ap-9f,  -0x1.e353f8p-10f, -0x1.4fdf3ap-10f, -0x1.eecbfep-11f, -0x1.b3d07cp-11f,
    -0x1.78d500p-11f, -0x1.3dd982p-11f, -0x1.02de02p-11f, -0x1.8fc506p-12f, -0x1.19ce0ap-12f, -0x1.47ae16p-13f,
    -0x1.743e96p-14f, -0x1.15df66p-14f, -0x1.6f0068p-15f, -0x1.64840cp-16f, -0x1.040bfep-17f, -0x1.b43528p-19f,
    -0x1.27476ep-21f, 0x0.0p+0f,        0x1.27476ep-21f,  0x1.b43528p-19f,  0x1.040bfep-17f,  0x1.64840cp-16f,
    0x1.6f0068p-15f,  0x1.15df66p-14f,  0x1.743e96p-14f,  0x1.47ae16p-13f,  0x1.19ce0ap-12f,  0x1.8fc506p-12f,
    0x1.02de02p-11f,  0x1.3dd982p-11f,  0x1.78d500p-11f,  0x1.b3d07cp-11f,  0x1.eecbfep-11f,  0x1.4fdf3ap-10f,
    0x1.e353f8p-10f,  0x1.3b645ap-9f,   0x1.851eb8p-9f,   0x1.ced914p-9f,   0x1.0c49bap-8f,   0x1.3126e8p-8f,
    0x1.56041ap-8f,   0x1.7ae148p-8f,   0x1.9fbe76p-8f,   0x1.c49ba6p-8f,   0x1.e978d4p-8f,   0x1.072b02p-7f,
    0x1.19999ap-7f,   0x1.2c0830p-7f,   0x1.3e76c8p-7f,   0x1.75c290p-7f,   0x1.d1eb86p-7f,   0x1.170a3ep-6f,
    0x1.451eb8p-6f,   0x1.733334p-6f,   0x1.a147aep-6f,   0x1.cf5c26p-6f,   0x1.fd70a4p-6f,   0x1.15c28ep-5f,
    0x1.2ccccep-5f,   0x1.43d70ap-5f,   0x1.5ae146p-5f,   0x1.71eb86p-5f,   0x1.88f5c2p-5f,   0x1.a00000p-5f,
    0x1.b70a3ep-5f,   0x1.ce147ap-5f,   0x1.e51ebap-5f,   0x1.fc28f4p-5f,   0x1.09999ap-4f,   0x1.151ebap-4f,
    0x1.20a3d6p-4f,   0x1.2c28f6p-4f,   0x1.37ae14p-4f,   0x1.433334p-4f,   0x1.4eb850p-4f,   0x1.5a3d70p-4f,
    0x1.65c290p-4f,   0x1.7147aep-4f,   0x1.7ccccep-4f,   0x1.8851eap-4f,   0x1.93d70ap-4f,   0x1.b66668p-4f,
    0x1.f00000p-4f,   0x1.14ccccp-3f,   0x1.31999ap-3f,   0x1.4e6666p-3f,   0x1.6b3332p-3f,   0x1.880000p-3f,
    0x1.a4ccccp-3f,   0x1.c1999ap-3f,   0x1.de6668p-3f,   0x1.fb3334p-3f,   0x1.0c0000p-2f,   0x1.1a6668p-2f,
    0x1.28ccccp-2f,   0x1.373334p-2f,   0x1.459998p-2f,   0x1.540000p-2f,   0x1.626664p-2f,   0x1.70ccccp-2f,
    0x1.7f3334p-2f,   0x1.8d9998p-2f,   0x1.9c0000p-2f,   0x1.aa6664p-2f,   0x1.b8ccccp-2f,   0x1.c73334p-2f,
    0x1.d59998p-2f,   0x1.e40000p-2f,   0x1.f26668p-2f,   0x1.006666p-1f,   0x1.07999ap-1f,   0x1.0eccccp-1f,
    0x1.160000p-1f,   0x1.1d3334p-1f,   0x1.246668p-1f,   0x1.2b999ap-1f,   0x1.32ccccp-1f,   0x1.3a0000p-1f,
    0x1.413334p-1f,   0x1.486666p-1f,   0x1.4f999ap-1f,   0x1.56cccep-1f,   0x1.5e0000p-1f,   0x1.653334p-1f,
    0x1.6c6668p-1f,   0x1.73999ap-1f,   0x1.7acccep-1f,   0x1.820000p-1f,   0x1.893334p-1f,   0x1.906666p-1f,
    0x1.979998p-1f,   0x1.9eccccp-1f,   0x1.a60000p-1f,   0x1.ad3332p-1f,   0x1.b46666p-1f,   0x1.bb9998p-1f,
    0x1.c2ccccp-1f,   0x1.ca0000p-1f,   0x1.d13334p-1f,   0x1.d86666p-1f,   0x1.df9998p-1f,   0x1.e6ccccp-1f,
    0x1.ee0000p-1f,   0x1.f53332p-1f,   0x1.fc6666p-1f,   0x1.000000p+0f,
};

constexpr std::array<float, 16> nf4_table = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// The midpoints between consecutive levels, in float32 as bitsandbytes computes them
// ((code[:-1] + code[1:]) / 2); a value's code is the number of midpoints below it
// (torch.bucketize), so a value on a midpoint takes the lower level.
template <std::size_t N>
std::array<float, N - 1> midpoints(const std::array<float, N>& levels) {
  std::array<float, N - 1> m{};
  for (std::size_t i = 0; i + 1 < N; ++i) m[i] = (levels[i] + levels[i + 1]) / 2.0f;
  return m;
}

const std::array<float, 15>& nf4_bounds() {
  static const std::array<float, 15> b = midpoints(nf4_table);
  return b;
}

template <std::size_t N>
std::uint8_t bucket(const std::array<float, N>& bounds, float v) {
  return static_cast<std::uint8_t>(std::lower_bound(bounds.begin(), bounds.end(), v) - bounds.begin());
}

// bitsandbytes clamps an absmax to at least 1e-38 before taking its reciprocal (a block of zeros
// then codes its values as 0).
constexpr float min_absmax = 1e-38f;

float bf16_to_float(std::uint16_t b) {
  const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void check_shape(std::size_t size, std::int64_t rows, std::int64_t cols, const std::string& what) {
  if (rows < 0 || cols < 0 || static_cast<std::uint64_t>(rows) * static_cast<std::uint64_t>(cols) != size) {
    std::ostringstream s;
    s << "cannot quantize " << what << ": " << size << " values do not make a [" << rows << ", " << cols << "] matrix";
    throw InternalError(s.str());
  }
}

void check_finite(float v, std::int64_t index, std::int64_t cols, const std::string& what) {
  if (std::isfinite(v)) return;
  std::ostringstream s;
  s << "cannot quantize " << what << ": its value at [" << index / cols << ", " << index % cols << "] is " << v
    << "; quantized storage needs finite weights (check the checkpoint this tensor came from)";
  throw UserError(s.str());
}

// bitsandbytes' dynamic8 code of a point of torch.linspace(-1, 1, 65536): the nearest level
// (no point is equidistant from two), built once.
const std::array<std::uint8_t, 65536>& dynamic8_table_of_points() {
  static const std::array<std::uint8_t, 65536> table = [] {
    std::array<std::uint8_t, 65536> t{};
    std::size_t code = 0;
    for (std::size_t i = 0; i < t.size(); ++i) {
      const double x = -1.0 + 2.0 * static_cast<double>(i) / 65535.0;
      while (code + 1 < dynamic8_table.size() && std::fabs(static_cast<double>(dynamic8_table[code + 1]) - x) <
                                                     std::fabs(static_cast<double>(dynamic8_table[code]) - x))
        ++code;
      t[i] = static_cast<std::uint8_t>(code);
    }
    return t;
  }();
  return table;
}

// torch's cascade_sum (aten/src/ATen/native/cpu/SumKernel.cpp) of a contiguous float32 row on one
// thread with 8-lane vectors: the row as vectors, summed by 4 accumulators (multi_row_sum) whose
// partial sums move up 4 levels every 2^max(4, ceil(log2(n)) / 4) vectors, the vectors left over
// added to the first, the accumulators added in order, then the scalar tail and the lanes.
float torch_cascade_sum(std::span<const float> x) {
  constexpr std::int64_t lanes = 8, ilp = 4, levels = 4;
  using Vec = std::array<float, lanes>;
  auto add = [](Vec& a, const Vec& b) {
    for (std::int64_t l = 0; l < lanes; ++l) a[l] += b[l];
  };
  auto load = [&](std::int64_t v) {
    Vec out;
    std::memcpy(out.data(), x.data() + v * lanes, sizeof out);
    return out;
  };
  const auto n = static_cast<std::int64_t>(x.size());
  const std::int64_t vectors = n / lanes, rows = vectors / ilp;
  std::int64_t log2 = 0;
  while ((std::int64_t{1} << log2) < rows) ++log2;
  const std::int64_t power = std::max<std::int64_t>(4, log2 / levels), step = std::int64_t{1} << power, mask = step - 1;
  Vec acc[levels][ilp] = {};
  std::int64_t i = 0;
  while (i + step <= rows) {
    for (std::int64_t j = 0; j < step; ++j, ++i)
      for (std::int64_t k = 0; k < ilp; ++k) add(acc[0][k], load(i * ilp + k));
    for (std::int64_t j = 1; j < levels; ++j) {
      for (std::int64_t k = 0; k < ilp; ++k) {
        add(acc[j][k], acc[j - 1][k]);
        acc[j - 1][k] = Vec{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < rows; ++i)
    for (std::int64_t k = 0; k < ilp; ++k) add(acc[0][k], load(i * ilp + k));
  for (std::int64_t j = 1; j < levels; ++j)
    for (std::int64_t k = 0; k < ilp; ++k) add(acc[0][k], acc[j][k]);
  Vec sum = acc[0][0];
  for (std::int64_t v = rows * ilp; v < vectors; ++v) add(sum, load(v));
  for (std::int64_t k = 1; k < ilp; ++k) add(sum, acc[0][k]);
  float total = 0.0f;
  for (std::int64_t e = vectors * lanes; e < n; ++e) total += x[static_cast<std::size_t>(e)];
  for (std::int64_t l = 0; l < lanes; ++l) total += sum[l];
  return total;
}

// The part of the row-major matrix that starts at each entry of part_rows, checked.
std::vector<std::int64_t> part_first_blocks(std::span<const std::int64_t> part_rows, std::int64_t rows,
                                            std::int64_t cols, const std::string& what) {
  std::vector<std::int64_t> first;
  bool ok = !part_rows.empty() && part_rows.front() == 0 && part_rows.back() == rows;
  for (std::size_t i = 0; ok && i + 1 < part_rows.size(); ++i) {
    ok = part_rows[i] < part_rows[i + 1] && (part_rows[i] * cols) % nf4_block_size == 0;
    first.push_back(part_rows[i] * cols / nf4_block_size);
  }
  if (!ok) {
    std::ostringstream s;
    s << "cannot quantize " << what << " in parts: the rows where they start must rise from 0 to " << rows
      << ", each on a block of " << nf4_block_size << " values (" << cols << " columns)";
    throw InternalError(s.str());
  }
  return first;
}

template <class Load>
Nf4Matrix quantize_nf4_impl(std::int64_t rows, std::int64_t cols, const std::string& what, Load load,
                            std::span<const std::int64_t> part_rows) {
  Nf4Matrix m;
  m.rows = rows;
  m.cols = cols;
  const std::int64_t n = rows * cols;
  const std::int64_t blocks = (n + nf4_block_size - 1) / nf4_block_size;
  const std::vector<std::int64_t> firsts =
      part_rows.empty() ? std::vector<std::int64_t>{0} : part_first_blocks(part_rows, rows, cols, what);
  m.codes.assign(static_cast<std::size_t>((n + 1) / 2), 0);
  std::vector<float> absmax(static_cast<std::size_t>(blocks));
  const auto& bounds = nf4_bounds();
  std::array<float, nf4_block_size> x{};
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::int64_t begin = b * nf4_block_size, len = std::min(nf4_block_size, n - begin);
    float a = 0.0f;
    for (std::int64_t i = 0; i < len; ++i) {
      x[i] = load(begin + i);
      check_finite(x[i], begin + i, cols, what);
      a = std::max(a, std::fabs(x[i]));
    }
    absmax[b] = a;
    const float inv = 1.0f / std::max(a, min_absmax);
    // Each code counts the midpoints below its scaled value: bound by bound over the whole block,
    // which the compiler vectorises (a binary search per value does not: 5x slower on Zen 5).
    std::array<float, nf4_block_size> scaled{};
    std::array<std::int32_t, nf4_block_size> code{};
    for (std::int64_t i = 0; i < len; ++i) scaled[i] = std::clamp(x[i] * inv, -1.0f, 1.0f);
    for (const float bound : bounds)
      for (std::int64_t i = 0; i < nf4_block_size; ++i) code[i] += bound < scaled[i] ? 1 : 0;
    for (std::int64_t i = 0; i < len; ++i) {
      const std::int64_t e = begin + i;
      const auto c = static_cast<std::uint8_t>(code[i]);
      m.codes[e / 2] |= (e % 2 == 0) ? static_cast<std::uint8_t>(c << 4) : c;
    }
  }
  // bitsandbytes pads an odd count with a 0, whose code (7) fills the last low nibble.
  if (n % 2 == 1) m.codes.back() |= bucket(bounds, 0.0f);

  // Double quantization (bitsandbytes' compress_statistics), over each part on its own: centre the
  // absmaxes on their float32 mean (offset = _absmax.mean()), then quantize them blockwise (256)
  // to the dynamic 8-bit code as its CPU kernel does: each value times the reciprocal of its
  // group's absmax, then dynamic8_code.
  m.absmax_codes.resize(static_cast<std::size_t>(blocks));
  for (std::size_t p = 0; p < firsts.size(); ++p) {
    const std::int64_t first = firsts[p], last = p + 1 < firsts.size() ? firsts[p + 1] : blocks;
    const std::int64_t count = last - first;
    const float offset =
        count > 0 ? torch_cascade_sum(std::span<const float>(absmax.data() + first, static_cast<std::size_t>(count))) /
                        static_cast<float>(count)
                  : 0.0f;
    if (p == 0) m.absmax_offset = offset;
    if (firsts.size() > 1) m.parts.push_back({first, static_cast<std::int64_t>(m.absmax_scales.size()), offset});
    for (std::int64_t begin = first; begin < last; begin += nf4_absmax_block_size) {
      const std::int64_t len = std::min(nf4_absmax_block_size, last - begin);
      float s = 0.0f;
      for (std::int64_t i = 0; i < len; ++i) s = std::max(s, std::fabs(absmax[begin + i] - offset));
      m.absmax_scales.push_back(s);
      const float inv = 1.0f / std::max(s, min_absmax);
      for (std::int64_t i = 0; i < len; ++i)
        m.absmax_codes[begin + i] = dynamic8_code(std::clamp((absmax[begin + i] - offset) * inv, -1.0f, 1.0f));
    }
  }
  return m;
}

template <class Load>
Int8Matrix quantize_int8_impl(std::int64_t rows, std::int64_t cols, const std::string& what, Load load) {
  Int8Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.codes.resize(static_cast<std::size_t>(rows * cols));
  m.scales.resize(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) {
    float a = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float v = load(r * cols + c);
      check_finite(v, r * cols + c, cols, what);
      a = std::max(a, std::fabs(v));
    }
    m.scales[r] = a / 127.0f;
    // As bitsandbytes' int8_vectorwise_quant: round(value * (127 / absmax)), halves to even.
    const float k = a > 0.0f ? 127.0f / a : 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float q = std::nearbyint(load(r * cols + c) * k);
      m.codes[r * cols + c] = static_cast<std::int8_t>(std::clamp(q, -127.0f, 127.0f));
    }
  }
  return m;
}

// ---- Dequantization kernels ----

// The absmax of each block a run of values touches, computed as bitsandbytes dequantizes them.
float block_absmax(const Nf4Matrix& m, std::int64_t b) {
  const float code = dynamic8_table[m.absmax_codes[b]];
  if (m.parts.empty()) return code * m.absmax_scales[b / nf4_absmax_block_size] + m.absmax_offset;
  std::size_t p = m.parts.size() - 1;
  while (p > 0 && m.parts[p].first_block > b) --p;
  const Nf4Matrix::Part& part = m.parts[p];
  const float scaled = code * m.absmax_scales[part.first_scale + (b - part.first_block) / nf4_absmax_block_size];
  return scaled + part.offset;
}

inline float nf4_value(const Nf4Matrix& m, std::int64_t e, float a) {
  const std::uint8_t byte = m.codes[e / 2];
  return nf4_table[(e % 2 == 0) ? byte >> 4 : byte & 15] * a;
}

#if defined(__x86_64__)

// Decodes n values from flat index e (even) with one absmax a into out, 8 at a time: 4 bytes
// become 8 indices (high nibble first), looked up in the two halves of the table.
void nf4_run_avx2(const std::uint8_t* codes, std::int64_t n, float a, float* out) {
  const __m256 lo_table = _mm256_loadu_ps(nf4_table.data());
  const __m256 hi_table = _mm256_loadu_ps(nf4_table.data() + 8);
  const __m256 scale = _mm256_set1_ps(a);
  const __m128i low_nibble = _mm_set1_epi16(0x0f);
  for (std::int64_t i = 0; i + 8 <= n; i += 8) {
    std::int32_t word;
    std::memcpy(&word, codes + i / 2, 4);
    const __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(word));
    const __m128i pairs = _mm_or_si128(_mm_srli_epi16(w, 4), _mm_slli_epi16(_mm_and_si128(w, low_nibble), 8));
    const __m256i idx = _mm256_cvtepu8_epi32(pairs);
    const __m256 lo = _mm256_permutevar8x32_ps(lo_table, idx);
    const __m256 hi = _mm256_permutevar8x32_ps(hi_table, idx);
    const __m256 v = _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(v, scale));
  }
}

// As nf4_run_avx2, 16 at a time: the 16 levels fill one zmm, so one VPERMPS looks them up.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void nf4_run_avx512(const std::uint8_t* codes, std::int64_t n,
                                                                         float a, float* out) {
  const __m512 table = _mm512_loadu_ps(nf4_table.data());
  const __m512 scale = _mm512_set1_ps(a);
  const __m128i low_nibble = _mm_set1_epi16(0x0f);
  for (std::int64_t i = 0; i + 16 <= n; i += 16) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i / 2)));
    const __m128i pairs = _mm_or_si128(_mm_srli_epi16(w, 4), _mm_slli_epi16(_mm_and_si128(w, low_nibble), 8));
    const __m512i idx = _mm512_cvtepu8_epi32(pairs);
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_permutexvar_ps(idx, table), scale));
  }
}

void int8_run_avx2(const std::int8_t* codes, std::int64_t n, float s, float* out) {
  const __m256 scale = _mm256_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtepi32_ps(q), scale));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(codes[i]) * s;
}

__attribute__((target("avx512f,avx512bw,avx512vl"))) void int8_run_avx512(const std::int8_t* codes, std::int64_t n,
                                                                          float s, float* out) {
  const __m512 scale = _mm512_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_cvtepi32_ps(q), scale));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(codes[i]) * s;
}

#else

// Elsewhere (not x86-64) the same arithmetic, one value at a time.
void nf4_run_avx2(const std::uint8_t* codes, std::int64_t n, float a, float* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = nf4_table[(i % 2 == 0) ? codes[i / 2] >> 4 : codes[i / 2] & 15] * a;
}
void nf4_run_avx512(const std::uint8_t* codes, std::int64_t n, float a, float* out) {
  nf4_run_avx2(codes, n, a, out);
}
void int8_run_avx2(const std::int8_t* codes, std::int64_t n, float s, float* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(codes[i]) * s;
}
void int8_run_avx512(const std::int8_t* codes, std::int64_t n, float s, float* out) {
  int8_run_avx2(codes, n, s, out);
}

#endif  // __x86_64__

std::atomic<bool> avx2_forced{false};

bool use_avx512() {
#if defined(__x86_64__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
#else
  constexpr bool has = false;
#endif
  return has && !avx2_forced.load(std::memory_order_relaxed);
}

void check_range(std::int64_t rows, std::int64_t cols, std::int64_t row0, std::int64_t nrows, std::int64_t col0,
                 std::int64_t ncols, std::int64_t ld) {
  if (row0 < 0 || nrows < 0 || col0 < 0 || ncols < 0 || row0 + nrows > rows || col0 + ncols > cols || ld < ncols) {
    std::ostringstream s;
    s << "dequantize: rows [" << row0 << ", " << row0 + nrows << ") x columns [" << col0 << ", " << col0 + ncols
      << ") with leading dimension " << ld << " do not lie in a [" << rows << ", " << cols << "] matrix";
    throw InternalError(s.str());
  }
}

}  // namespace

const std::array<float, 16>& nf4_levels() {
  return nf4_table;
}
const std::array<float, 256>& dynamic8_levels() {
  return dynamic8_table;
}

std::uint8_t dynamic8_code(float x) {
  // In float32, as the kernel computes the point's index (the file is built without contraction).
  const float index = std::floor((x + 1.0f) * 32767.5f + 0.5f);
  const auto i = static_cast<std::int64_t>(std::clamp(index, 0.0f, 65535.0f));
  return dynamic8_table_of_points()[static_cast<std::size_t>(i)];
}

float torch_float32_mean(std::span<const float> values) {
  return values.empty() ? 0.0f : torch_cascade_sum(values) / static_cast<float>(values.size());
}

float Nf4Matrix::absmax(std::int64_t block) const {
  return block_absmax(*this, block);
}

std::int64_t Nf4Matrix::storage_bytes() const {
  return static_cast<std::int64_t>(codes.size() + absmax_codes.size() + absmax_scales.size() * sizeof(float) +
                                   sizeof(float) + parts.size() * sizeof(Part));
}

std::int64_t Int8Matrix::storage_bytes() const {
  return static_cast<std::int64_t>(codes.size() + scales.size() * sizeof(float));
}

Nf4Matrix quantize_nf4(std::span<const float> values, std::int64_t rows, std::int64_t cols, const std::string& what) {
  return quantize_nf4(values, rows, cols, what, {});
}

Nf4Matrix quantize_nf4_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                            const std::string& what) {
  return quantize_nf4_bf16(values, rows, cols, what, {});
}

Nf4Matrix quantize_nf4(std::span<const float> values, std::int64_t rows, std::int64_t cols, const std::string& what,
                       std::span<const std::int64_t> part_rows) {
  check_shape(values.size(), rows, cols, what);
  return quantize_nf4_impl(
      rows, cols, what, [&](std::int64_t i) { return values[i]; }, part_rows);
}

Nf4Matrix quantize_nf4_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                            const std::string& what, std::span<const std::int64_t> part_rows) {
  check_shape(values.size(), rows, cols, what);
  return quantize_nf4_impl(
      rows, cols, what, [&](std::int64_t i) { return bf16_to_float(values[i]); }, part_rows);
}

Int8Matrix quantize_int8(std::span<const float> values, std::int64_t rows, std::int64_t cols, const std::string& what) {
  check_shape(values.size(), rows, cols, what);
  return quantize_int8_impl(rows, cols, what, [&](std::int64_t i) { return values[i]; });
}

Int8Matrix quantize_int8_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                              const std::string& what) {
  check_shape(values.size(), rows, cols, what);
  return quantize_int8_impl(rows, cols, what, [&](std::int64_t i) { return bf16_to_float(values[i]); });
}

void dequantize(const Nf4Matrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld) {
  check_range(m.rows, m.cols, row0, nrows, col0, ncols, ld);
  const bool wide = use_avx512();
  const std::int64_t step = wide ? 16 : 8;
  for (std::int64_t r = 0; r < nrows; ++r) {
    float* dst = out + r * ld;
    std::int64_t e = (row0 + r) * m.cols + col0;
    const std::int64_t end = e + ncols;
    // One segment per nf4 block the run touches: one absmax for each.
    while (e < end) {
      const std::int64_t block = e / nf4_block_size;
      const std::int64_t stop = std::min(end, (block + 1) * nf4_block_size);
      const float a = block_absmax(m, block);
      if (e % 2 == 1) *dst++ = nf4_value(m, e++, a);
      const std::int64_t vec = (stop - e) / step * step;
      if (vec > 0) {
        if (wide)
          nf4_run_avx512(m.codes.data() + e / 2, vec, a, dst);
        else
          nf4_run_avx2(m.codes.data() + e / 2, vec, a, dst);
        dst += vec;
        e += vec;
      }
      for (; e < stop; ++e) *dst++ = nf4_value(m, e, a);
    }
  }
}

void dequantize(const Int8Matrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld) {
  check_range(m.rows, m.cols, row0, nrows, col0, ncols, ld);
  const bool wide = use_avx512();
  for (std::int64_t r = 0; r < nrows; ++r) {
    const std::int8_t* src = m.codes.data() + (row0 + r) * m.cols + col0;
    if (wide)
      int8_run_avx512(src, ncols, m.scales[row0 + r], out + r * ld);
    else
      int8_run_avx2(src, ncols, m.scales[row0 + r], out + r * ld);
  }
}

std::vector<float> dequantize(const Nf4Matrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  dequantize(m, 0, m.rows, 0, m.cols, out.data(), m.cols);
  return out;
}

std::vector<float> dequantize(const Int8Matrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  dequantize(m, 0, m.rows, 0, m.cols, out.data(), m.cols);
  return out;
}

const char* storage_format_name(StorageFormat format) {
  switch (format) {
    case StorageFormat::f32:
      return "f32";
    case StorageFormat::bf16:
      return "bf16";
    case StorageFormat::int8:
      return "int8";
    case StorageFormat::nf4:
      return "nf4";
  }
  return "?";
}

std::int64_t StoredMatrix::storage_bytes() const {
  switch (format) {
    case StorageFormat::bf16:
      return static_cast<std::int64_t>(bf16.size() * sizeof(std::uint16_t));
    case StorageFormat::int8:
      return int8.storage_bytes();
    case StorageFormat::nf4:
      return nf4.storage_bytes();
    case StorageFormat::f32:
      break;
  }
  return 0;
}

namespace {

template <class T, class Nf4, class Int8, class Bf16>
StoredMatrix store_impl(std::span<const T> values, std::int64_t rows, std::int64_t cols, StorageFormat format,
                        const std::string& what, Nf4 nf4, Int8 int8, Bf16 bf16) {
  StoredMatrix m;
  m.format = format;
  m.rows = rows;
  m.cols = cols;
  switch (format) {
    case StorageFormat::nf4:
      m.nf4 = nf4(values, rows, cols, what);
      return m;
    case StorageFormat::int8:
      m.int8 = int8(values, rows, cols, what);
      return m;
    case StorageFormat::bf16:
      check_shape(values.size(), rows, cols, what);
      m.bf16.resize(values.size());
      for (std::size_t i = 0; i < values.size(); ++i) m.bf16[i] = bf16(values[i]);
      return m;
    case StorageFormat::f32:
      break;
  }
  throw InternalError("store: " + what + " in format f32 (the parameter's own value)");
}

// Round to nearest even, NaN kept a NaN (tensor.hpp's to_bfloat16).
std::uint16_t float_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

// Parts that do not each start on an nf4 block cannot keep the blocks bitsandbytes would give
// each part: the matrix is then quantized as one.
std::span<const std::int64_t> block_aligned(std::span<const std::int64_t> part_rows, std::int64_t cols) {
  for (const std::int64_t r : part_rows)
    if ((r * cols) % nf4_block_size != 0) return {};
  return part_rows.size() > 2 ? part_rows : std::span<const std::int64_t>{};
}

}  // namespace

StoredMatrix store(std::span<const float> values, std::int64_t rows, std::int64_t cols, StorageFormat format,
                   const std::string& what) {
  return store(values, rows, cols, format, what, {});
}

StoredMatrix store_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                        StorageFormat format, const std::string& what) {
  return store_bf16(values, rows, cols, format, what, {});
}

StoredMatrix store(std::span<const float> values, std::int64_t rows, std::int64_t cols, StorageFormat format,
                   const std::string& what, std::span<const std::int64_t> part_rows) {
  const auto parts = block_aligned(part_rows, cols);
  return store_impl(
      values, rows, cols, format, what,
      [parts](std::span<const float> v, std::int64_t r, std::int64_t c, const std::string& w) {
        return quantize_nf4(v, r, c, w, parts);
      },
      [](std::span<const float> v, std::int64_t r, std::int64_t c, const std::string& w) {
        return quantize_int8(v, r, c, w);
      },
      float_to_bf16);
}

StoredMatrix store_bf16(std::span<const std::uint16_t> values, std::int64_t rows, std::int64_t cols,
                        StorageFormat format, const std::string& what, std::span<const std::int64_t> part_rows) {
  const auto parts = block_aligned(part_rows, cols);
  return store_impl(
      values, rows, cols, format, what,
      [parts](std::span<const std::uint16_t> v, std::int64_t r, std::int64_t c, const std::string& w) {
        return quantize_nf4_bf16(v, r, c, w, parts);
      },
      [](std::span<const std::uint16_t> v, std::int64_t r, std::int64_t c, const std::string& w) {
        return quantize_int8_bf16(v, r, c, w);
      },
      [](std::uint16_t b) { return b; });
}

void dequantize(const StoredMatrix& m, std::int64_t row0, std::int64_t nrows, std::int64_t col0, std::int64_t ncols,
                float* out, std::int64_t ld) {
  switch (m.format) {
    case StorageFormat::nf4:
      dequantize(m.nf4, row0, nrows, col0, ncols, out, ld);
      return;
    case StorageFormat::int8:
      dequantize(m.int8, row0, nrows, col0, ncols, out, ld);
      return;
    case StorageFormat::bf16:
      check_range(m.rows, m.cols, row0, nrows, col0, ncols, ld);
      // A shift per value: the compiler vectorises it for the build's baseline (AVX2).
      for (std::int64_t r = 0; r < nrows; ++r) {
        const std::uint16_t* src = m.bf16.data() + (row0 + r) * m.cols + col0;
        float* dst = out + r * ld;
        for (std::int64_t c = 0; c < ncols; ++c) {
          const std::uint32_t u = std::uint32_t{src[c]} << 16;
          std::memcpy(dst + c, &u, sizeof u);
        }
      }
      return;
    case StorageFormat::f32:
      break;
  }
  throw InternalError("dequantize: a stored matrix in format f32");
}

std::vector<float> dequantize(const StoredMatrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.rows * m.cols));
  dequantize(m, 0, m.rows, 0, m.cols, out.data(), m.cols);
  return out;
}

const char* dequantize_kernels() {
  return use_avx512() ? "avx512" : "avx2";
}

void force_avx2_kernels(bool on) {
  avx2_forced.store(on, std::memory_order_relaxed);
}

}  // namespace loom::quant
