// The quantization codecs (sdk/include/loom/quantization.hpp): NF4's levels, round-trip error on
// normal weights against bitsandbytes' published figures, codes and absmaxes against a NumPy
// version of the algorithm (quantization_reference.py), int8's bound, the range dequantization a
// GEMM's packing uses, and the AVX2 and AVX-512 kernels agreeing bit for bit.
#include "loom/quantization.hpp"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "loom/error.hpp"
#include "reference_required.hpp"
#include "test_support.hpp"

namespace loom::quant {
namespace {

namespace fs = std::filesystem;

std::vector<float> normal_weights(std::int64_t n, float sigma, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> w(static_cast<std::size_t>(n));
  for (auto& v : w) v = normal(rng);
  return w;
}

// Restores the automatic kernel choice when a test that forces AVX2 ends, however it ends.
struct ForceAvx2 {
  ForceAvx2() { force_avx2_kernels(true); }
  ~ForceAvx2() { force_avx2_kernels(false); }
};

TEST(Nf4, LevelsAreBitsandbytesTable) {
  // bitsandbytes.functional.get_4bit_type("nf4") (bitsandbytes 0.50.2), as float32 bit patterns;
  // the paper's Appendix E lists the same values to 16 digits.
  const std::array<std::uint32_t, 16> expected = {
      0xbf800000, 0xbf3239b1, 0xbf066b30, 0xbeca32a0, 0xbe91a24d, 0xbe3d353f, 0xbdba7871, 0x00000000,
      0x3da2faff, 0x3e24cae3, 0x3e7c04dd, 0x3ead033a, 0x3ee1a4b8, 0x3f1007ab, 0x3f3913b3, 0x3f800000};
  for (int i = 0; i < 16; ++i) EXPECT_EQ(std::bit_cast<std::uint32_t>(nf4_levels()[i]), expected[i]) << "level " << i;
}

TEST(Nf4, NormalWeightsRoundTripWithBitsandbytesError) {
  // bitsandbytes' tests/test_functional.py (TestQuantize4BitFunctional.test_4bit_quant) measured
  // NF4 with blocks of 64 on randn(1024, 1024) over 1000 samples: mean |error| 0.072792 (in units
  // of the weights' standard deviation; the codec is scale-invariant) and mean relative error
  // 0.203299, and asserts each within + 1e-3. Here with sigma 0.02 (a typical initialisation)
  // and double-quantized absmaxes, as QLoRA stores them.
  const float sigma = 0.02f;
  const std::int64_t rows = 1024, cols = 1024;
  const auto w = normal_weights(rows * cols, sigma, 1);
  const Nf4Matrix m = quantize_nf4(w, rows, cols);
  const auto back = dequantize(m);
  double abs_err = 0.0, rel_err = 0.0;
  for (std::size_t i = 0; i < w.size(); ++i) {
    const double e = std::fabs(static_cast<double>(w[i]) - back[i]);
    abs_err += e;
    rel_err += e / (std::fabs(w[i]) + 1e-8 * sigma);
  }
  abs_err /= static_cast<double>(w.size()) * sigma;
  rel_err /= static_cast<double>(w.size());
  std::cout << "nf4 round trip of normal(0, 0.02): mean |error| " << abs_err << " sigma, mean relative error "
            << rel_err << "\n";
  EXPECT_NEAR(abs_err, 0.072792, 1e-3);
  EXPECT_LT(rel_err, 0.203299 + 1e-3);
  EXPECT_GT(rel_err, 0.203299 - 5e-3);
  // 4.127 bits a weight: 4 + 8 / 64 (absmax codes) + 32 / 16384 (scales).
  EXPECT_NEAR(static_cast<double>(m.storage_bytes()) * 8 / (rows * cols), 4.127, 1e-3);
}

TEST(Nf4, EachValueTakesTheNearestLevel) {
  // One block: value i / 63 * 2 - 1 (and the block's absmax 1 exactly): each code is the level
  // nearest to the value; dequantization gives that level times the absmax.
  std::vector<float> w(64);
  for (int i = 0; i < 64; ++i) w[i] = static_cast<float>(i) / 63.0f * 2.0f - 1.0f;
  const Nf4Matrix m = quantize_nf4(w, 1, 64);
  const auto back = dequantize(m);
  for (int i = 0; i < 64; ++i) {
    float best = nf4_levels()[0];
    for (const float l : nf4_levels())
      if (std::fabs(l - w[i]) < std::fabs(best - w[i])) best = l;
    const std::uint8_t byte = m.codes[i / 2];
    const int code = i % 2 == 0 ? byte >> 4 : byte & 15;
    EXPECT_EQ(nf4_levels()[code], best) << "value " << w[i];
    EXPECT_NEAR(back[i], best, 1e-6f) << "value " << w[i];
  }
}

TEST(Nf4, Bf16InputGivesTheCodesOfItsFloat32Widening) {
  const auto w = normal_weights(3 * 200, 0.02f, 2);
  std::vector<std::uint16_t> bf16(w.size());
  std::vector<float> widened(w.size());
  for (std::size_t i = 0; i < w.size(); ++i) {
    bf16[i] = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(w[i]) >> 16);
    widened[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bf16[i]) << 16);
  }
  const Nf4Matrix a = quantize_nf4_bf16(bf16, 3, 200), b = quantize_nf4(widened, 3, 200);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.absmax_codes, b.absmax_codes);
  EXPECT_EQ(a.absmax_scales, b.absmax_scales);
  EXPECT_EQ(a.absmax_offset, b.absmax_offset);
  const Int8Matrix c = quantize_int8_bf16(bf16, 3, 200), d = quantize_int8(widened, 3, 200);
  EXPECT_EQ(c.codes, d.codes);
  EXPECT_EQ(c.scales, d.scales);
}

// bitsandbytes 0.50.2's own double quantization (tests/quant/bitsandbytes_expected.py ran its CPU
// kernel: functional.py:938-940, offset = _absmax.mean() and quantize_blockwise(_absmax - offset,
// blocksize=256); backends/cpu/ops.py:38-55, cquantize_blockwise_cpu_fp32) of a [256, 1024] bf16
// matrix, quantized whole and as three tensors (a fused q, k, v: each its own mean and groups, as
// bitsandbytes quantizes each projection): its float32 means and scales, a hash of its absmax
// codes, and the blocks where its 65536-point table gives a code other than the nearest level.
std::uint64_t fnv1a64(const std::vector<std::uint8_t>& bytes) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (const std::uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

TEST(Nf4, DoubleQuantizationIsBitsandbytes) {
  constexpr std::int64_t rows = 256, cols = 1024;
  std::vector<float> w(rows * cols);
  std::uint32_t r = 12345;
  for (auto& v : w) {
    std::int64_t sum = 0;
    for (int k = 0; k < 4; ++k) {
      r = r * 1664525u + 1013904223u;
      sum += r >> 16;
    }
    std::uint32_t u = std::bit_cast<std::uint32_t>(static_cast<float>(sum - 2 * 65535) * 0x1p-23f);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16 << 16;  // to bf16, nearest even
    v = std::bit_cast<float>(u);
  }
  struct Expected {
    std::vector<std::int64_t> parts;
    std::vector<float> offsets, scales;
    std::uint64_t hash;
    std::vector<std::pair<std::int64_t, int>> not_nearest;  // block, bitsandbytes' code
  };
  const Expected whole{{},
                       {0x1.6929f00000000p-7f},
                       {0x1.db58400000000p-9f, 0x1.eb58400000000p-9f, 0x1.eb58400000000p-9f, 0x1.aca7c00000000p-9f,
                        0x1.cb58400000000p-9f, 0x1.dca7c00000000p-9f, 0x1.bca7c00000000p-9f, 0x1.c4a7c00000000p-9f,
                        0x1.ab58400000000p-9f, 0x1.84a7c00000000p-9f, 0x1.0dac200000000p-8f, 0x1.d358400000000p-9f,
                        0x1.e0a7c00000000p-9f, 0x1.01ac200000000p-8f, 0x1.1053e00000000p-8f, 0x1.d4a7c00000000p-9f},
                       0x95021711760db540ull,
                       {{1172, 189}, {1244, 189}, {1254, 189}}};
  const Expected parts{{0, 128, 192, 256},
                       {0x1.67a2600000000p-7f, 0x1.6b22000000000p-7f, 0x1.6a41000000000p-7f},
                       {0x1.e176800000000p-9f, 0x1.f176800000000p-9f, 0x1.f176800000000p-9f, 0x1.b176800000000p-9f,
                        0x1.d176800000000p-9f, 0x1.d689800000000p-9f, 0x1.c176800000000p-9f, 0x1.c176800000000p-9f,
                        0x1.ac88000000000p-9f, 0x1.8c88000000000p-9f, 0x1.09bc000000000p-8f, 0x1.cb78000000000p-9f,
                        0x1.e504000000000p-9f, 0x1.fefc000000000p-9f, 0x1.1282000000000p-8f, 0x1.d904000000000p-9f},
                       0x37866cd95ddffa9bull,
                       {{1045, 210}, {3334, 176}, {3353, 176}, {3399, 176}, {3581, 176}}};
  for (const Expected* e : {&whole, &parts}) {
    SCOPED_TRACE(e == &whole ? "whole" : "q, k and v");
    const Nf4Matrix m = quantize_nf4(w, rows, cols, "qkv", e->parts);
    EXPECT_EQ(m.absmax_offset, e->offsets.front());
    EXPECT_EQ(m.absmax_scales, e->scales);
    for (const auto& [block, code] : e->not_nearest)
      EXPECT_EQ(m.absmax_codes.at(static_cast<std::size_t>(block)), code) << "block " << block;
    EXPECT_EQ(fnv1a64(m.absmax_codes), e->hash) << "the absmax codes are bitsandbytes'";
    if (e->parts.empty()) continue;
    ASSERT_EQ(m.parts.size(), 3u);
    for (std::size_t p = 0; p < 3; ++p) {
      EXPECT_EQ(m.parts[p].offset, e->offsets[p]) << "part " << p;
      EXPECT_EQ(m.parts[p].first_block, e->parts[p] * cols / nf4_block_size) << "part " << p;
    }
    // Each part's blocks dequantize with its own statistics: as that part quantized alone.
    for (std::size_t p = 0; p < 3; ++p) {
      const std::int64_t b = e->parts[p], n = e->parts[p + 1] - b;
      const Nf4Matrix alone = quantize_nf4(std::span<const float>(w).subspan(b * cols, n * cols), n, cols);
      std::vector<float> in_parts(n * cols);
      dequantize(m, b, n, 0, cols, in_parts.data(), cols);
      EXPECT_EQ(in_parts, dequantize(alone)) << "part " << p;
    }
  }
}

TEST(Int8, RoundTripErrorIsAtMostHalfAScale) {
  const std::int64_t rows = 64, cols = 333;
  auto w = normal_weights(rows * cols, 0.02f, 3);
  for (std::int64_t c = 0; c < cols; ++c) w[5 * cols + c] = 0.0f;  // a row of zeros: scale 0
  w[7 * cols + 11] = 0.5f;                                         // an outlier sets row 7's scale
  const Int8Matrix m = quantize_int8(w, rows, cols);
  const auto back = dequantize(m);
  EXPECT_EQ(m.scales[5], 0.0f);
  EXPECT_EQ(m.scales[7], 0.5f / 127.0f);
  for (std::int64_t r = 0; r < rows; ++r) {
    float absmax = 0.0f;
    for (std::int64_t c = 0; c < cols; ++c) absmax = std::max(absmax, std::fabs(w[r * cols + c]));
    EXPECT_EQ(m.scales[r], absmax / 127.0f);
    for (std::int64_t c = 0; c < cols; ++c) {
      const float x = w[r * cols + c], y = back[r * cols + c];
      // Half a step, plus the float32 roundings of x * (127 / absmax) and code * scale.
      EXPECT_LE(std::fabs(x - y), m.scales[r] / 2 + 4e-7f * std::fabs(x)) << "[" << r << ", " << c << "]";
      EXPECT_LE(std::abs(static_cast<int>(m.codes[r * cols + c])), 127);
    }
  }
}

// A range of rows and columns, into a buffer with a leading dimension, equals the same range of
// the whole matrix: at every column offset and width, so that runs start on odd values and cross
// nf4 blocks; with both kernel sets.
template <class M>
void check_ranges(const M& m) {
  const auto whole = dequantize(m);
  for (const bool avx2 : {false, true}) {
    force_avx2_kernels(avx2);
    SCOPED_TRACE(dequantize_kernels());
    for (std::int64_t col0 : {0, 1, 3, 16, 63, 64, 65, 100})
      for (std::int64_t ncols : {1, 7, 16, 17, 64, 65, 129}) {
        if (col0 + ncols > m.cols) continue;
        const std::int64_t row0 = 2, nrows = 3, ld = ncols + 5;
        std::vector<float> out(static_cast<std::size_t>(nrows * ld), -7.0f);
        dequantize(m, row0, nrows, col0, ncols, out.data(), ld);
        for (std::int64_t r = 0; r < nrows; ++r) {
          for (std::int64_t c = 0; c < ncols; ++c)
            ASSERT_EQ(std::bit_cast<std::uint32_t>(out[r * ld + c]),
                      std::bit_cast<std::uint32_t>(whole[(row0 + r) * m.cols + col0 + c]))
                << "row " << row0 + r << ", column " << col0 + c;
          for (std::int64_t c = ncols; c < ld; ++c) ASSERT_EQ(out[r * ld + c], -7.0f) << "wrote past the range";
        }
      }
  }
  force_avx2_kernels(false);
}

TEST(Dequantize, RangesMatchTheWholeMatrixOnEveryKernelSet) {
  const auto w = normal_weights(9 * 197, 0.02f, 4);  // 197 columns: blocks straddle rows
  check_ranges(quantize_nf4(w, 9, 197));
  check_ranges(quantize_int8(w, 9, 197));
}

TEST(Dequantize, KernelSetsAgreeBitForBit) {
  const auto w = normal_weights(128 * 512, 0.02f, 5);
  const Nf4Matrix n = quantize_nf4(w, 128, 512);
  const Int8Matrix i = quantize_int8(w, 128, 512);
  const auto n_auto = dequantize(n), i_auto = dequantize(i);
  ForceAvx2 avx2;
  EXPECT_STREQ(dequantize_kernels(), "avx2");
  EXPECT_EQ(std::memcmp(n_auto.data(), dequantize(n).data(), n_auto.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(i_auto.data(), dequantize(i).data(), i_auto.size() * sizeof(float)), 0);
}

TEST(Quantize, NonFiniteWeightIsAUserErrorNamingWhere) {
  std::vector<float> w(4 * 8, 0.01f);
  w[2 * 8 + 5] = std::nanf("");
  try {
    quantize_nf4(w, 4, 8, "layers.0.attn.q.weight");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("layers.0.attn.q.weight"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[2, 5]"), std::string::npos) << e.what();
  }
  w[2 * 8 + 5] = INFINITY;
  EXPECT_THROW(quantize_int8(w, 4, 8), UserError);
}

TEST(Dequantize, RangeOutsideTheMatrixIsRefused) {
  const Nf4Matrix m = quantize_nf4(std::vector<float>(4 * 64, 0.5f), 4, 64);
  std::vector<float> out(4 * 64);
  EXPECT_THROW(dequantize(m, 3, 2, 0, 64, out.data(), 64), InternalError);
  EXPECT_THROW(dequantize(m, 0, 1, 10, 60, out.data(), 64), InternalError);
  EXPECT_THROW(dequantize(m, 0, 1, 0, 64, out.data(), 32), InternalError);
}

// ---- Against the NumPy reference ----

template <class T>
std::vector<T> read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
  return v;
}

TEST(QuantReference, CodesAndAbsmaxEqualTheNumpyAlgorithm) {
  std::error_code ec;
  if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec))
    return test::skip_missing_reference(std::string("numpy is not available: there is no Python environment at ") +
                                        LOOM_REFERENCE_ENV_PYTHON + " (scripts/setup-python-env.sh makes it)");
  test::TempDir work;
  struct Case {
    std::string name;
    std::int64_t rows, cols;
    std::vector<float> w;
  };
  std::vector<Case> cases;
  // 300 blocks (two absmax groups, the second partial); a partial last block; an odd count; a
  // block of zeros and an outlier; a constant matrix (every absmax equal: all centred to 0).
  cases.push_back({"normal", 96, 200, normal_weights(96 * 200, 0.02f, 6)});
  cases.push_back({"odd", 7, 9, normal_weights(63, 1.0f, 7)});
  auto mixed = normal_weights(40 * 64, 0.05f, 8);
  for (int i = 64; i < 128; ++i) mixed[i] = 0.0f;
  mixed[1000] = 3.0f;
  cases.push_back({"mixed", 40, 64, mixed});
  cases.push_back({"constant", 4, 96, std::vector<float>(4 * 96, 0.25f)});
  nlohmann::json list = nlohmann::json::array();
  for (const auto& c : cases) {
    std::ofstream(work.path() / (c.name + ".f32"), std::ios::binary)
        .write(reinterpret_cast<const char*>(c.w.data()), static_cast<std::streamsize>(c.w.size() * sizeof(float)));
    list.push_back({{"name", c.name}, {"rows", c.rows}, {"cols", c.cols}});
  }
  std::ofstream(work.path() / "cases.json") << list.dump();
  const auto r = test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_QUANT_REFERENCE_SCRIPT, work.path().string()});
  if (r.exit_code == 77) return test::skip_missing_reference(r.err.substr(0, r.err.find('\n')));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(work.path() / "reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);

  // The levels derived from normal quantiles as the paper constructs them (in float64) equal
  // loom's (bitsandbytes') float32 table within the 4 float32 roundings bitsandbytes' construction
  // makes (quantiles, normalisation).
  const auto derived = ref.at("normal_float_levels").get<std::vector<double>>();
  ASSERT_EQ(derived.size(), 16u);
  for (int i = 0; i < 16; ++i) EXPECT_NEAR(nf4_levels()[i], derived[i], 2.5e-7) << "level " << i;
  // bitsandbytes' dynamic 8-bit map, computed by its own construction, bit for bit.
  const auto dyn = ref.at("dynamic_map").get<std::vector<float>>();
  ASSERT_EQ(dyn.size(), 256u);
  for (int i = 0; i < 256; ++i) EXPECT_EQ(dynamic8_levels()[i], dyn[i]) << "dynamic code " << i;

  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path base = work.path() / c.name;
    const Nf4Matrix m = quantize_nf4(c.w, c.rows, c.cols);
    EXPECT_EQ(m.codes, read_file<std::uint8_t>(base.string() + ".nf4"));
    EXPECT_EQ(m.absmax_codes, read_file<std::uint8_t>(base.string() + ".absmax_codes"));
    EXPECT_EQ(m.absmax_scales, read_file<float>(base.string() + ".absmax_scales"));
    EXPECT_EQ(m.absmax_offset, ref.at("offsets").at(c.name).get<float>());
    const auto deq = read_file<float>(base.string() + ".nf4_dequant");
    const auto mine = dequantize(m);
    ASSERT_EQ(mine.size(), deq.size());
    for (std::size_t i = 0; i < deq.size(); ++i)
      ASSERT_EQ(std::bit_cast<std::uint32_t>(mine[i]), std::bit_cast<std::uint32_t>(deq[i]))
          << "nf4 dequantization of value " << i << ": " << mine[i] << " here, " << deq[i] << " in the reference";
    const Int8Matrix q = quantize_int8(c.w, c.rows, c.cols);
    EXPECT_EQ(q.codes, read_file<std::int8_t>(base.string() + ".int8"));
    EXPECT_EQ(q.scales, read_file<float>(base.string() + ".int8_scales"));
  }
}

}  // namespace
}  // namespace loom::quant
