// loom_bench_quant: dequantization throughput of the frozen-weight formats
// (sdk/include/loom/quantization.hpp), in GB/s of float32 written, on one thread, for each
// kernel set this CPU runs (AVX2, the build's baseline, is always there), against a float32 copy of the same range
// (what a float32 weight's packing costs). Two shapes: a whole 4096 x 4096 weight (its float32 output, 64 MiB, streams
// to memory) and a GEMM packing panel of 64 rows x 1024 columns (256 KiB, stays in cache). Then
// quantization of the whole weight, GB/s of float32 read.
//
//   build/bin/loom_bench_quant
//   build/bin/loom_bench_quant --benchmark_filter=panel
#include <benchmark/benchmark.h>

#include <cstring>
#include <loom/quantization.hpp>
#include <random>
#include <vector>

namespace {

namespace q = loom::quant;

constexpr std::int64_t rows = 4096, cols = 4096;

const std::vector<float>& weights() {
  static const std::vector<float> w = [] {
    std::mt19937_64 rng(1);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    std::vector<float> v(static_cast<std::size_t>(rows * cols));
    for (auto& x : v) x = normal(rng);
    return v;
  }();
  return w;
}

// The range a run dequantizes: the whole weight, or one panel (walking down the weight, so that
// its codes come from memory as a GEMM's would).
struct Range {
  std::int64_t nrows, ncols;
};
Range range_of(bool panel) {
  return panel ? Range{64, 1024} : Range{rows, cols};
}

template <class M>
void run(benchmark::State& state, const M& m) {
  const bool panel = state.range(0) != 0;
  const bool avx2 = state.range(1) != 0;
  q::force_avx2_kernels(avx2);
  state.SetLabel(q::dequantize_kernels());
  const Range r = range_of(panel);
  std::vector<float> out(static_cast<std::size_t>(r.nrows * r.ncols));
  std::int64_t row0 = 0;
  for (auto _ : state) {
    q::dequantize(m, row0, r.nrows, 0, r.ncols, out.data(), r.ncols);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    row0 = (row0 + r.nrows) % rows;
  }
  q::force_avx2_kernels(false);
  state.SetBytesProcessed(state.iterations() * r.nrows * r.ncols * static_cast<std::int64_t>(sizeof(float)));
}

void nf4(benchmark::State& state) {
  static const q::Nf4Matrix m = q::quantize_nf4(weights(), rows, cols);
  run(state, m);
}

void int8(benchmark::State& state) {
  static const q::Int8Matrix m = q::quantize_int8(weights(), rows, cols);
  run(state, m);
}

void f32_copy(benchmark::State& state) {
  const Range r = range_of(state.range(0) != 0);
  std::vector<float> out(static_cast<std::size_t>(r.nrows * r.ncols));
  std::int64_t row0 = 0;
  for (auto _ : state) {
    for (std::int64_t i = 0; i < r.nrows; ++i)
      std::memcpy(out.data() + i * r.ncols, weights().data() + (row0 + i) * cols, r.ncols * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    row0 = (row0 + r.nrows) % rows;
  }
  state.SetBytesProcessed(state.iterations() * r.nrows * r.ncols * static_cast<std::int64_t>(sizeof(float)));
}

// Quantizing the whole weight (once per weight, at load): GB/s of float32 read.
void nf4_quantize(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(q::quantize_nf4(weights(), rows, cols));
  state.SetBytesProcessed(state.iterations() * rows * cols * static_cast<std::int64_t>(sizeof(float)));
}

void int8_quantize(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(q::quantize_int8(weights(), rows, cols));
  state.SetBytesProcessed(state.iterations() * rows * cols * static_cast<std::int64_t>(sizeof(float)));
}

// Args: {panel, force AVX2}.
BENCHMARK(nf4)->ArgNames({"panel", "avx2"})->ArgsProduct({{0, 1}, {0, 1}});
BENCHMARK(int8)->ArgNames({"panel", "avx2"})->ArgsProduct({{0, 1}, {0, 1}});
BENCHMARK(f32_copy)->ArgNames({"panel"})->Arg(0)->Arg(1);
BENCHMARK(nf4_quantize)->Unit(benchmark::kMillisecond);
BENCHMARK(int8_quantize)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
