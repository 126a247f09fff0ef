// `loom bench gemm`: see gemm_bench.hpp for what is measured and how.
#include "loom/run/gemm_bench.hpp"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "loom/autograd.hpp"
#include "loom/error.hpp"
#include "loom/kinds/backend.hpp"

namespace loom {

namespace {

using std::int64_t;

// Uniform values in [-1, 1) from a 64-bit xorshift (as attention_bench.cpp).
std::vector<float> random_values(std::size_t n, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  std::vector<float> v(n);
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
  return v;
}

template <class F>
double median_ms(int repeats, F&& run) {
  run();  // warm-up: first-touch pages, packing buffers, the thread pool
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const std::size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

// oneDNN's bf16 GEMM, loaded at run time when the library is installed (Debian's libdnnl2);
// loom does not link it. Row-major, like cblas.
using DnnlGemmBf16 = int (*)(char transa, char transb, int64_t m, int64_t n, int64_t k, float alpha,
                             const std::uint16_t* a, int64_t lda, const std::uint16_t* b, int64_t ldb, float beta,
                             float* c, int64_t ldc);

DnnlGemmBf16 load_onednn(int threads) {
  // oneDNN's OpenMP threads: as many as the pool, passive when idle so that they do not spin
  // against the pool after each call; libgomp reads these when the library loads.
  setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 0);
  setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  void* library = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  return reinterpret_cast<DnnlGemmBf16>(dlsym(library, "dnnl_gemm_bf16bf16f32"));
}

std::vector<std::uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = to_bfloat16(v[i]).bits;
  return out;
}

}  // namespace

std::vector<GemmShape> gpt2_small_gemm_shapes(int64_t tokens) {
  const int64_t d = 768, vocab = 50257;
  return {
      {"qkv", tokens, 3 * d, d, false, false},      {"attn_out", tokens, d, d, false, false},
      {"mlp_up", tokens, 4 * d, d, false, false},   {"mlp_down", tokens, d, 4 * d, false, false},
      {"mlp_up_dX", tokens, d, 4 * d, false, true}, {"mlp_up_dW", d, 4 * d, tokens, true, false},
      {"lm_head", tokens, vocab, d, false, true},   {"lm_head_dW", vocab, d, tokens, true, false},
  };
}

DType parse_compute_dtype(const std::string& text, const std::string& where) {
  if (text == "f32" || text == "float32") return DType::f32;
  if (text == "bf16" || text == "bfloat16") return DType::bf16;
  throw UserError(where + ": unknown compute dtype '" + text + "' (f32 or bf16)");
}

void parse_gemm_dtypes(const std::vector<std::string>& names, GemmBenchOptions& options, const std::string& where) {
  options.dtypes.clear();
  options.weight_formats.clear();
  for (const std::string& name : names) {
    if (name == "int8")
      options.weight_formats.push_back(quant::StorageFormat::int8);
    else if (name == "nf4")
      options.weight_formats.push_back(quant::StorageFormat::nf4);
    else if (name == "f32" || name == "float32" || name == "bf16" || name == "bfloat16")
      options.dtypes.push_back(parse_compute_dtype(name, where));
    else
      throw UserError(where + ": unknown dtype '" + name +
                      "' (f32 or bf16: the compute dtype; int8 or nf4: a weight stored in that format)");
  }
}

std::vector<GemmBenchResult> run_gemm_bench(const Registry& registry, const GemmBenchOptions& o,
                                            const std::function<void(const GemmBenchResult&)>& progress) {
  if (o.backends.empty()) throw UserError("no backend to measure: name at least one (--backends cpu)");
  if (o.dtypes.empty() && o.weight_formats.empty())
    throw UserError("no dtype to measure: name at least one (--dtypes f32,bf16)");
  if (o.shapes.empty()) throw UserError("no GEMM shape to measure");
  if (o.repeats < 1) throw UserError("repeats must be at least 1, not " + std::to_string(o.repeats));
  for (const GemmShape& s : o.shapes)
    if (s.m <= 0 || s.n <= 0 || s.k <= 0)
      throw UserError("GEMM shape '" + s.name + "' must have positive sizes, not " + std::to_string(s.m) + "x" +
                      std::to_string(s.n) + "x" + std::to_string(s.k));

  std::vector<Handle<Backend>> backends;
  for (ComponentRef ref : o.backends) {
    // `f32` times Backend::gemm, which must then be the float32 product: a backend whose products
    // are bf16 by default (the cpu backend's matmul_precision: auto, on a CPU with AVX512-BF16)
    // is created with matmul_precision: f32 unless the reference sets it. `bf16` calls
    // gemm_bf16, which that option does not change.
    const ComponentEntry* entry = registry.find("backend", ref.name);
    if (entry && entry->decl.options.find("matmul_precision") && ref.node.is_map() &&
        !ref.node.find("matmul_precision"))
      ref.node.set("matmul_precision", Value("f32"));
    backends.push_back(registry.create<Backend>(ref));
    // A device backend gets its operands in its own memory; the stored weights' products
    // dequantize on the host.
    if (!o.weight_formats.empty())
      require_host_memory(*backends.back(), "loom bench gemm --dtypes int8/nf4 (a stored weight's products)");
  }
  const bool want_bf16 = std::find(o.dtypes.begin(), o.dtypes.end(), DType::bf16) != o.dtypes.end();
  const DnnlGemmBf16 onednn = o.libraries && want_bf16 ? load_onednn(registry.execution().num_threads()) : nullptr;

  std::vector<GemmBenchResult> results;
  auto record = [&](GemmBenchResult r, const GemmShape& s) {
    r.shape = s.name;
    r.gflops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k) / (r.ms * 1e6);
    if (progress) progress(r);
    results.push_back(r);
  };
  std::uint64_t seed = o.seed;
  for (const GemmShape& s : o.shapes) {
    const int64_t lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    const std::vector<float> a = random_values(static_cast<std::size_t>(s.m * s.k), ++seed);
    const std::vector<float> b = random_values(static_cast<std::size_t>(s.k * s.n), ++seed);
    std::vector<float> c(static_cast<std::size_t>(s.m * s.n));
    const Transpose ta = s.trans_a ? Transpose::yes : Transpose::no, tb = s.trans_b ? Transpose::yes : Transpose::no;
    // The operands in each device backend's memory (host backends use the vectors): copied once
    // per shape, outside the timing. A device backend's products are asynchronous: each timed
    // run ends by copying one element of C to the host, which waits for the product.
    struct DeviceOperands {
      Tensor a, b, c;
    };
    std::vector<DeviceOperands> on_device(backends.size());
    for (std::size_t i = 0; i < backends.size(); ++i) {
      if (backends[i]->buffer_type().host_visible()) continue;
      const Device device = backends[i]->device();
      on_device[i].a = Tensor::from(std::span<const float>(a), Shape{static_cast<int64_t>(a.size())}).to(device);
      on_device[i].b = Tensor::from(std::span<const float>(b), Shape{static_cast<int64_t>(b.size())}).to(device);
      on_device[i].c = Tensor::empty(Shape{s.m * s.n}, DType::f32, device);
    }
    for (DType dtype : o.dtypes) {
      for (std::size_t i = 0; i < backends.size(); ++i) {
        Backend& be = *backends[i];
        const bool device = on_device[i].c.defined();
        const float* pa = device ? on_device[i].a.device_data<float>() : a.data();
        const float* pb = device ? on_device[i].b.device_data<float>() : b.data();
        float* pc = device ? on_device[i].c.device_data<float>() : c.data();
        const auto wait = [&] {
          if (device) (void)on_device[i].c.slice(0, 0, 1).item();
        };
        GemmBenchResult r;
        r.backend = o.backends[i].name;
        r.dtype = dtype;
        if (dtype == DType::bf16) {
          r.fallback = !be.supports_op(BackendOp::gemm, DType::bf16);
          // Backend::gemm_bf16's own fallback rounds copies on the host: for a device backend
          // without bf16 kernels, the float32 product stands for it (the row says fallback).
          const bool as_f32 = r.fallback && device;
          r.ms = median_ms(o.repeats, [&] {
            if (as_f32)
              be.gemm(ta, tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, pc, s.n);
            else
              be.gemm_bf16(ta, tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, pc, s.n);
            wait();
          });
        } else {
          r.ms = median_ms(o.repeats, [&] {
            be.gemm(ta, tb, s.m, s.n, s.k, 1.0f, pa, lda, pb, ldb, 0.0f, pc, s.n);
            wait();
          });
        }
        record(r, s);
      }
      if (!o.libraries) continue;
      GemmBenchResult r;
      r.library = true;
      r.dtype = dtype;
      if (dtype == DType::f32) {
        r.backend = "openblas";
        r.ms = median_ms(o.repeats, [&] {
          cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                      static_cast<blasint>(s.m), static_cast<blasint>(s.n), static_cast<blasint>(s.k), 1.0f, a.data(),
                      static_cast<blasint>(lda), b.data(), static_cast<blasint>(ldb), 0.0f, c.data(),
                      static_cast<blasint>(s.n));
        });
        record(r, s);
      } else if (onednn != nullptr) {
        r.backend = "onednn";
        const std::vector<std::uint16_t> a16 = to_bf16_bits(a), b16 = to_bf16_bits(b);
        r.ms = median_ms(o.repeats, [&] {
          onednn(s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N', s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb,
                 0.0f, c.data(), s.n);
        });
        record(r, s);
      }
    }
    // A weight stored in fewer bits: Ops::linear, which dequantizes panels of it.
    if (!s.trans_a)
      for (const quant::StorageFormat format : o.weight_formats)
        for (std::size_t i = 0; i < backends.size(); ++i) {
          Backend& be = *backends[i];
          const int64_t rows = s.trans_b ? s.n : s.k, cols = s.trans_b ? s.k : s.n;
          Parameter w("w", Tensor::from(std::span<const float>(b), Shape{rows, cols}));
          w.set_stored(std::make_shared<quant::StoredMatrix>(
              quant::store(std::span<const float>(b), rows, cols, format, s.name)));
          const Tensor x = Tensor::from(std::span<const float>(a), Shape{s.m, s.k});
          Ops ops(be);
          GemmBenchResult r;
          r.backend = o.backends[i].name;
          r.dtype = be.matmul_dtype();
          r.weight = format;
          LinearOptions layout;
          layout.weight_in_out = !s.trans_b;
          r.ms = median_ms(o.repeats, [&] { ops.linear(x, w.tensor(), Tensor(), layout); });
          record(r, s);
        }
  }
  return results;
}

std::string format_gemm_bench(const GemmBenchOptions& o, const std::vector<GemmBenchResult>& results, int threads) {
  std::size_t name_width = 8;
  for (const auto& r : results) name_width = std::max(name_width, r.backend.size() + (r.fallback ? 11 : 0));
  std::ostringstream s;
  char line[512];
  bool any_fallback = false, any_onednn = false;
  for (std::size_t first = 0; first < results.size();) {
    std::size_t last = first;
    while (last < results.size() && results[last].shape == results[first].shape) ++last;
    const GemmShape* shape = nullptr;
    for (const GemmShape& g : o.shapes)
      if (g.name == results[first].shape) shape = &g;
    s << results[first].shape;
    if (shape != nullptr)
      s << "  (m " << shape->m << ", n " << shape->n << ", k " << shape->k << (shape->trans_a ? ", A^T" : "")
        << (shape->trans_b ? ", B^T" : "");
    s << ", " << threads << (threads == 1 ? " thread" : " threads") << ", median of " << o.repeats << ")\n";
    std::snprintf(line, sizeof line, "  %-*s %5s %10s %10s %12s %10s\n", static_cast<int>(name_width), "backend",
                  "dtype", "ms", "GFLOP/s", "vs library", "vs f32");
    s << line;
    for (std::size_t i = first; i < last; ++i) {
      const GemmBenchResult& r = results[i];
      any_fallback = any_fallback || r.fallback;
      any_onednn = any_onednn || r.backend == "onednn";
      double library = 0.0, f32 = 0.0;
      for (std::size_t j = first; j < last; ++j) {
        if (results[j].library && results[j].dtype == r.dtype) library = results[j].gflops;
        if (results[j].backend == r.backend && results[j].label() == "f32") f32 = results[j].gflops;
      }
      const std::string name = r.backend + (r.fallback ? " (fallback)" : "");
      char vs_library[32] = "-", vs_f32[32] = "-";
      if (!r.library && library > 0) std::snprintf(vs_library, sizeof vs_library, "%.2fx", r.gflops / library);
      if (r.label() != "f32" && f32 > 0) std::snprintf(vs_f32, sizeof vs_f32, "%.2fx", r.gflops / f32);
      std::snprintf(line, sizeof line, "  %-*s %5s %10.3f %10.1f %12s %10s\n", static_cast<int>(name_width),
                    name.c_str(), r.label().c_str(), r.ms, r.gflops, vs_library, vs_f32);
      s << line;
    }
    s << "\n";
    first = last;
  }
  s << "GFLOP/s: 2 m n k per run. vs library: this GFLOP/s over the library call's of the same dtype (openblas:\n"
       "one single-threaded cblas_sgemm, as the core holds OpenBLAS to one thread";
  if (any_onednn) s << ";\nonednn: dnnl_gemm_bf16bf16f32 on operands already in bf16, " << threads << " OpenMP threads";
  s << ").\nvs f32: bf16 GFLOP/s over the same backend's f32.\n";
  if (!o.weight_formats.empty())
    s << "int8, nf4: the product with B stored in that format (lora.base_dtype), dequantized a panel at a time\n"
         "into the backend's float32 gemm (Ops::linear); vs f32: over the same backend's f32 on the float32 B.\n"
         "Shapes with A^T (weight gradients, which frozen weights have none of) have no such row.\n";
  if (std::find_if(o.dtypes.begin(), o.dtypes.end(), [](DType t) { return t == DType::bf16; }) != o.dtypes.end() &&
      !any_onednn && o.libraries)
    s << "onednn: libdnnl.so.2 could not be loaded, so bf16 has no library baseline.\n";
  if (any_fallback)
    s << "(fallback): this backend has no bf16 kernels on this CPU (no AVX512-BF16): gemm_bf16 rounded the inputs to\n"
         "bf16 and ran the float32 GEMM.\n";
  return s.str();
}

}  // namespace loom
