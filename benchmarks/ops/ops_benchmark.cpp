// loom_bench_ops: every operation of a backend, forward and backward, at GPT-2 small shapes
// (C = 768, MLP 4C, vocabulary 50257, 12 heads of 64, batches of 4x256 and 4x1024 tokens).
//
// In the same run it measures the two references the summary compares against:
//   * raw cblas_sgemm (OpenBLAS on all cores, its own threading) on the exact GEMMs each
//     GEMM-bound operation performs: the GEMM path is reported as a fraction of raw OpenBLAS;
//   * a parallel copy kernel: each memory-bound operation is reported as the fraction of the
//     copy's bandwidth it reaches, counting the bytes it must read and write at least once.
// Forward passes run without a tape; a backward pass is timed alone (its forward is recorded
// with the timer paused, and the output gradient is handed over without a copy).
//
//   build/bin/loom_bench_ops                       # the cpu backend, a summary table at the end
//   build/bin/loom_bench_ops --benchmark_repetitions=3   # the summary keeps the fastest run
//   build/bin/loom_bench_ops --backend=reference --benchmark_filter=4x256
// Google Benchmark's flags (--benchmark_filter, --benchmark_format=json, ...) apply.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/random.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

using loom::Ops;
using loom::Parameter;
using loom::Shape;
using loom::Tape;
using loom::Tensor;
using std::int64_t;

constexpr int64_t C = 768, C4 = 3072, V = 50257, H = 12, D = 64;

struct Batch {
  const char* label;
  int64_t b, t;
  int64_t tokens() const { return b * t; }
};
constexpr Batch batches[] = {{"4x256", 4, 256}, {"4x1024", 4, 1024}};

// ---- What the summary needs to know about each benchmark.
enum class Kind { reference_gemm, reference_copy, gemm_bound, memory_bound, overhead };
struct Info {
  Kind kind;
  double work;          // flops (GEMM-bound), bytes (memory-bound) or operations (overhead) per iteration
  std::string compare;  // GEMM-bound: the raw sgemm benchmark it is compared with
};
std::map<std::string, Info>& infos() {
  static std::map<std::string, Info> m;
  return m;
}
std::vector<std::string>& order() {
  static std::vector<std::string> v;
  return v;
}

loom::Backend* backend = nullptr;

Tensor random(const Shape& s, std::uint64_t key, float scale = 1.0f) {
  Tensor t = Tensor::empty(s);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = scale * loom::random_normal(key, static_cast<std::uint32_t>(i));
  return t;
}

Tensor random_ids(const Shape& s, int64_t vocab, std::uint64_t key) {
  Tensor t = Tensor::empty(s, loom::DType::i32);
  auto* p = t.data<std::int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<std::int32_t>(loom::random_bits(key, static_cast<std::uint32_t>(i)) % vocab);
  return t;
}

// Benchmarks are registered after all are defined, references first: OpenBLAS's own threads,
// woken by the raw sgemm runs, are idle again by the time the operations run.
struct Pending {
  std::string name;
  std::function<void(benchmark::State&)> fn;
  int iterations;
};
std::vector<Pending>& pending() {
  static std::vector<Pending> v;
  return v;
}

void add(const std::string& name, Info info, std::function<void(benchmark::State&)> fn, int iterations = 0) {
  infos()[name] = std::move(info);
  order().push_back(name);
  pending().push_back({name, std::move(fn), iterations});
}

void register_all() {
  for (bool references : {true, false})
    for (const Pending& p : pending()) {
      const Kind k = infos().at(p.name).kind;
      if ((k == Kind::reference_gemm || k == Kind::reference_copy) != references) continue;
      auto* b = benchmark::RegisterBenchmark(p.name.c_str(), [fn = p.fn](benchmark::State& s) { fn(s); });
      b->Unit(benchmark::kMillisecond)->UseRealTime();
      if (p.iterations > 0)
        b->Iterations(p.iterations);
      else
        b->MinTime(0.15);
    }
}

// ---- References

// C[m, n] = op(A) op(B) with OpenBLAS's own threads on every core.
struct Gemm {
  bool ta, tb;
  int64_t m, n, k;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k); }
};

// Registers the raw sgemm sequence `gemms`, named after the operation it is the reference of
// ("sgemm/linear_qkv/forward/4x256"), and returns the name.
std::string raw_sgemm(const std::vector<Gemm>& gemms, const std::string& of, int iterations = 0) {
  const std::string name = "sgemm/" + of;
  double flops = 0;
  for (const Gemm& g : gemms) flops += g.flops();
  add(
      name, {Kind::reference_gemm, flops, ""},
      [gemms](benchmark::State& state) {
        std::vector<Tensor> a, b, c;
        for (const Gemm& g : gemms) {
          a.push_back(random({g.m * g.k}, 1, 0.1f));
          b.push_back(random({g.k * g.n}, 2, 0.1f));
          c.push_back(Tensor::empty({g.m * g.n}));
        }
        openblas_set_num_threads(loom::default_execution_context().num_threads());
        for (auto _ : state)
          for (std::size_t i = 0; i < gemms.size(); ++i) {
            const Gemm& g = gemms[i];
            cblas_sgemm(CblasRowMajor, g.ta ? CblasTrans : CblasNoTrans, g.tb ? CblasTrans : CblasNoTrans,
                        static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f, a[i].data<float>(),
                        static_cast<int>(g.ta ? g.m : g.k), b[i].data<float>(), static_cast<int>(g.tb ? g.k : g.n),
                        0.0f, c[i].data<float>(), static_cast<int>(g.n));
          }
        openblas_set_num_threads(1);  // back to the core's policy
      },
      iterations);
  return name;
}

void copy_reference() {
  constexpr int64_t n = int64_t{64} << 20;  // 256 MiB each way
  add(
      "copy/256MiB", {Kind::reference_copy, 2.0 * n * 4, ""},
      [](benchmark::State& state) {
        Tensor src = random({n}, 3), dst = Tensor::zeros({n});  // pages touched before timing
        const float* s = src.data<float>();
        float* d = dst.data<float>();
        for (auto _ : state) {
          loom::default_execution_context().parallel_for(n, 1 << 20, [&](int64_t b, int64_t e) {
            std::memcpy(d + b, s + b, static_cast<std::size_t>(e - b) * sizeof(float));
          });
          benchmark::ClobberMemory();
        }
      },
      20);
}

// ---- Operations

// A forward benchmark: `make` builds the inputs once; `run` is timed, without a tape.
using Inputs = std::vector<std::shared_ptr<Parameter>>;
using Make = std::function<Inputs()>;
using Run = std::function<Tensor(Ops&, const Inputs&)>;

std::shared_ptr<Parameter> param(const std::string& name, const Shape& s, std::uint64_t key, float scale = 1.0f) {
  return std::make_shared<Parameter>(name, random(s, key, scale));
}

void forward(const std::string& name, Info info, Make make, Run run, int iterations = 0) {
  add(
      name, std::move(info),
      [make, run](benchmark::State& state) {
        const Inputs in = make();
        Ops ops(*backend);
        for (auto _ : state) benchmark::DoNotOptimize(run(ops, in).raw_data());
      },
      iterations);
}

// A backward benchmark: the forward is recorded with the timer paused; the backward is timed.
void backward(const std::string& name, Info info, Make make, Run run, int iterations = 0) {
  add(
      name, std::move(info),
      [make, run](benchmark::State& state) {
        const Inputs in = make();
        Tape tape;
        Ops ops(*backend, &tape);
        for (auto _ : state) {
          state.PauseTiming();
          Tensor out = run(ops, in);
          Tensor seed = Tensor::full(out.shape(), 0.01f);
          state.ResumeTiming();
          tape.backward(out, std::move(seed));
        }
      },
      iterations);
}

void register_operations(const Batch& batch) {
  const std::string l = batch.label;
  const int64_t n = batch.tokens();
  const double f = 4.0;  // bytes per float
  const bool big = n > 1024;

  // ---- GEMM-bound: linear layers of a GPT-2 block, and the fused output projection + loss.
  struct Linear {
    const char* what;
    int64_t in, out;
    loom::Activation act;
  };
  for (Linear lin :
       {Linear{"qkv", C, 3 * C, loom::Activation::none}, Linear{"attn_proj", C, C, loom::Activation::none},
        Linear{"mlp_fc_gelu", C, C4, loom::Activation::gelu_tanh}, Linear{"mlp_proj", C4, C, loom::Activation::none}}) {
    Make make = [=] {
      return Inputs{param("x", {batch.b, batch.t, lin.in}, 1), param("w", {lin.out, lin.in}, 2, 0.02f),
                    param("b", {lin.out}, 3, 0.02f)};
    };
    Run run = [=](Ops& ops, const Inputs& in) {
      return ops.linear(in[0]->tensor(), in[1]->tensor(), in[2]->tensor(), {.activation = lin.act});
    };
    const Gemm fwd{false, true, n, lin.out, lin.in};
    const Gemm dx{false, false, n, lin.in, lin.out}, dw{true, false, lin.out, lin.in, n};
    const std::string op = "linear_" + std::string(lin.what);
    const std::string rf = raw_sgemm({fwd}, op + "/forward/" + l), rb = raw_sgemm({dx, dw}, op + "/backward/" + l);
    forward(op + "/forward/" + l, {Kind::gemm_bound, fwd.flops(), rf}, make, run);
    backward(op + "/backward/" + l, {Kind::gemm_bound, dx.flops() + dw.flops(), rb}, make, run);
  }
  {
    // Output projection and cross-entropy: logits, loss and both gradients, chunked.
    Make make = [=] { return Inputs{param("x", {batch.b, batch.t, C}, 4), param("wte", {V, C}, 5, 0.02f)}; };
    auto targets = std::make_shared<Tensor>(random_ids({batch.b, batch.t}, V, 6));
    Run run = [targets](Ops& ops, const Inputs& in) {
      return ops.linear_cross_entropy(in[0]->tensor(), in[1]->tensor(), *targets);
    };
    const Gemm logits{false, true, n, V, C}, dx{false, false, n, C, V}, dw{true, false, V, C, n};
    const int iters = big ? 1 : 2;
    const std::string raw = raw_sgemm({logits, dx, dw}, "linear_cross_entropy/forward+backward/" + l, iters);
    // Recording computes the gradients in the forward pass, so forward + backward is the unit.
    add(
        "linear_cross_entropy/forward+backward/" + l, {Kind::gemm_bound, logits.flops() + dx.flops() + dw.flops(), raw},
        [make, run](benchmark::State& state) {
          const Inputs in = make();
          Tape tape;
          Ops ops(*backend, &tape);
          for (auto _ : state) tape.backward(run(ops, in));
        },
        iters);
    if (!big) {  // evaluation (no tape): the logits GEMM and the loss only
      const std::string raw_fwd = raw_sgemm({logits}, "linear_cross_entropy/forward_eval/" + l, iters);
      forward("linear_cross_entropy/forward_eval/" + l, {Kind::gemm_bound, logits.flops(), raw_fwd}, make, run, iters);
    }
  }
  {
    // Batched matmul: attention scores, [B*H, T, D] x [B*H, D, T].
    const int64_t bh = batch.b * H;
    Make make = [=] { return Inputs{param("q", {bh, batch.t, D}, 7), param("k", {bh, batch.t, D}, 8)}; };
    Run run = [](Ops& ops, const Inputs& in) { return ops.matmul(in[0]->tensor(), in[1]->tensor(), false, true); };
    std::vector<Gemm> fwd(static_cast<std::size_t>(bh), Gemm{false, true, batch.t, batch.t, D});
    std::vector<Gemm> bwd;
    for (int64_t i = 0; i < bh; ++i) {
      bwd.push_back({false, false, batch.t, D, batch.t});
      bwd.push_back({true, false, batch.t, D, batch.t});
    }
    const double ff = static_cast<double>(bh) * fwd[0].flops();
    forward("matmul_scores/forward/" + l, {Kind::gemm_bound, ff, raw_sgemm(fwd, "matmul_scores/forward/" + l)}, make,
            run);
    backward("matmul_scores/backward/" + l, {Kind::gemm_bound, 2 * ff, raw_sgemm(bwd, "matmul_scores/backward/" + l)},
             make, run);
  }

  // ---- Memory-bound: bytes that must move at least once per call.
  const double nc = static_cast<double>(n * C), n4c = static_cast<double>(n * C4);
  auto x_c = [=] { return Inputs{param("x", {batch.b, batch.t, C}, 10)}; };
  auto x_4c = [=] { return Inputs{param("x", {batch.b, batch.t, C4}, 11, 2.0f)}; };
  auto norm_in = [=] {
    return Inputs{param("x", {batch.b, batch.t, C}, 12), param("w", {C}, 13), param("b", {C}, 14),
                  param("r", {batch.b, batch.t, C}, 15)};
  };
  auto mem = [&](const std::string& op, double fwd_bytes, double bwd_bytes, Make make, Run run) {
    forward(op + "/forward/" + l, {Kind::memory_bound, fwd_bytes, ""}, make, run);
    if (bwd_bytes > 0) backward(op + "/backward/" + l, {Kind::memory_bound, bwd_bytes, ""}, make, run);
  };
  mem("layer_norm", 2 * nc * f, 3 * nc * f, norm_in,
      [](Ops& ops, const Inputs& in) { return ops.layer_norm(in[0]->tensor(), in[1]->tensor(), in[2]->tensor()); });
  // Fused residual add + norm (forward: read two, write two). Backward through y: the norm's
  // backward writes d(sum), handed to one input and copied for the other.
  mem("add_layer_norm", 4 * nc * f, 5 * nc * f, norm_in, [](Ops& ops, const Inputs& in) {
    return ops.add_layer_norm(in[3]->tensor(), in[0]->tensor(), in[1]->tensor(), in[2]->tensor()).second;
  });
  mem("rms_norm", 2 * nc * f, 3 * nc * f, norm_in,
      [](Ops& ops, const Inputs& in) { return ops.rms_norm(in[0]->tensor(), in[1]->tensor()); });
  mem("gelu", 2 * n4c * f, 3 * n4c * f, x_4c, [](Ops& ops, const Inputs& in) { return ops.gelu(in[0]->tensor()); });
  mem("silu", 2 * n4c * f, 3 * n4c * f, x_4c, [](Ops& ops, const Inputs& in) { return ops.silu(in[0]->tensor()); });
  mem(
      "swiglu", 3 * n4c * f, 5 * n4c * f,
      [=] {
        return Inputs{param("g", {batch.b, batch.t, C4}, 16), param("u", {batch.b, batch.t, C4}, 17)};
      },
      [](Ops& ops, const Inputs& in) { return ops.swiglu(in[0]->tensor(), in[1]->tensor()); });
  // Residual add: the backward hands the gradient to one input and copies it for the other.
  mem("residual_add", 3 * nc * f, 2 * nc * f, norm_in,
      [](Ops& ops, const Inputs& in) { return ops.add(in[0]->tensor(), in[3]->tensor()); });
  mem("scale", 2 * nc * f, 2 * nc * f, x_c,
      [](Ops& ops, const Inputs& in) { return ops.scale(in[0]->tensor(), 0.5f); });
  mem("dropout", 2 * nc * f, 2 * nc * f, x_c,
      [](Ops& ops, const Inputs& in) { return ops.dropout(in[0]->tensor(), 0.1f); });
  {
    auto table = std::make_shared<loom::RopeTable>(loom::RopeConfig{}, D, batch.t);
    mem(
        "rope", 2 * nc * f, 2 * nc * f,
        [=] {
          return Inputs{param("q", {batch.b, batch.t, H, D}, 18)};
        },
        [table](Ops& ops, const Inputs& in) { return ops.rope(in[0]->tensor(), *table); });
  }
  {
    // Token embedding: the backward accumulates into an existing table gradient (tied weights:
    // the output projection has already written it).
    auto ids = std::make_shared<Tensor>(random_ids({batch.b, batch.t}, V, 19));
    mem(
        "embedding", 2 * nc * f, 3 * nc * f,
        [=] {
          auto wte = param("wte", {V, C}, 20, 0.02f);
          Tape t;
          Ops o(*backend, &t);
          t.backward(o.scale(wte->tensor(), 1.0f), Tensor::zeros({V, C}));  // a gradient buffer exists
          return Inputs{wte};
        },
        [ids](Ops& ops, const Inputs& in) { return ops.embedding(in[0]->tensor(), *ids); });
  }
  {
    // Cross-entropy on materialised logits: one streaming read forward; in place backward.
    auto targets = std::make_shared<Tensor>(random_ids({n}, V, 21));
    const double nv = static_cast<double>(n) * V;
    const int iters = big ? 3 : 0;
    Make make = [=] { return Inputs{param("logits", {n, V}, 22)}; };
    forward(
        "cross_entropy/forward/" + l, {Kind::memory_bound, nv * f, ""}, make,
        [targets](Ops& ops, const Inputs& in) { return ops.cross_entropy(in[0]->tensor(), *targets); }, iters);
    // Backward: the kernel that turns the logits into their own gradient in place (the
    // operation's backward is this one pass): read and write once.
    add(
        "cross_entropy/backward/" + l, {Kind::memory_bound, 2 * nv * f, ""},
        [=](benchmark::State& state) {
          Tensor logits = random({n, V}, 22), lse = Tensor::empty({n}), losses = Tensor::empty({n});
          backend->cross_entropy_forward(logits.data<float>(), V, targets->data<std::int32_t>(), losses.data<float>(),
                                         lse.data<float>(), n, V, -100);
          for (auto _ : state)
            backend->cross_entropy_backward(logits.data<float>(), V, targets->data<std::int32_t>(), lse.data<float>(),
                                            1.0f / static_cast<float>(n), n, V, -100);
        },
        iters);
  }
}

// Framework overhead: a chain of operations on tiny tensors ([8, 32]), where the cost is the
// operation's dispatch (validation, allocation from the cache, recording, the backward pass's
// bookkeeping) rather than its arithmetic: what decides the speed of a tiny model.
void register_overhead() {
  constexpr int layers = 16;
  constexpr double ops_per_layer = 4;  // linear, gelu, add, layer_norm
  for (bool record : {false, true}) {
    const std::string name = record ? "overhead/forward+backward/8x32" : "overhead/forward/8x32";
    add(name, {Kind::overhead, layers * ops_per_layer, ""}, [record](benchmark::State& state) {
      std::vector<std::shared_ptr<Parameter>> w;
      for (int i = 0; i < layers; ++i) w.push_back(std::make_shared<Parameter>("w", random({32, 32}, 30 + i, 0.1f)));
      auto g = std::make_shared<Parameter>("g", Tensor::full({32}, 1.0f));
      Parameter x("x", random({8, 32}, 29));
      Tape tape;
      Ops ops(*backend, record ? &tape : nullptr);
      for (auto _ : state) {
        Tensor h = x.tensor();
        for (int i = 0; i < layers; ++i)
          h = ops.layer_norm(ops.add(h, ops.gelu(ops.linear(h, w[static_cast<std::size_t>(i)]->tensor()))), g->tensor(),
                             Tensor());
        if (record) tape.backward(h, Tensor::full({8, 32}, 1.0f));
        benchmark::DoNotOptimize(h.raw_data());
      }
    });
  }
}

// Collects the time per iteration of every benchmark (the fastest of its repetitions, which is
// the least disturbed by other load on the machine) and prints the console output.
class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred) {
        const double t = r.real_accumulated_time / static_cast<double>(r.iterations);
        auto [it, fresh] = seconds_.emplace(r.run_name.function_name, t);
        if (!fresh) it->second = std::min(it->second, t);
      }
  }
  const std::map<std::string, double>& seconds() const { return seconds_; }

 private:
  std::map<std::string, double> seconds_;
};

void print_summary(const std::map<std::string, double>& seconds, const std::string& backend_name) {
  auto time_of = [&](const std::string& name) -> double {
    auto it = seconds.find(name);
    return it == seconds.end() ? 0.0 : it->second;
  };
  double copy_bw = 0;
  for (const auto& [name, info] : infos())
    if (info.kind == Kind::reference_copy && time_of(name) > 0) copy_bw = info.work / time_of(name);
  std::printf("\n## Summary: backend `%s`, %d threads\n\n", backend_name.c_str(),
              loom::default_execution_context().num_threads());
  std::printf("Copy kernel: %.1f GB/s (read + write).\n\n", copy_bw / 1e9);
  std::printf("| operation | pass | tokens | time (ms) | throughput | vs raw sgemm / vs copy |\n");
  std::printf("|---|---|---|---:|---:|---:|\n");
  for (const std::string& name : order()) {
    const Info& info = infos().at(name);
    const double t = time_of(name);
    if (t <= 0 || info.kind == Kind::reference_gemm || info.kind == Kind::reference_copy) continue;
    // name: op/pass/label
    const auto s1 = name.find('/'), s2 = name.find('/', s1 + 1);
    const std::string op = name.substr(0, s1), pass = name.substr(s1 + 1, s2 - s1 - 1), label = name.substr(s2 + 1);
    if (info.kind == Kind::overhead) {
      std::printf("| %s | %s | %s | %.3f | %.2f us per operation | |\n", op.c_str(), pass.c_str(), label.c_str(),
                  t * 1e3, t / info.work * 1e6);
    } else if (info.kind == Kind::gemm_bound) {
      const double raw = time_of(info.compare);
      std::printf("| %s | %s | %s | %.2f | %.1f GFLOP/s | %.3f |\n", op.c_str(), pass.c_str(), label.c_str(), t * 1e3,
                  info.work / t / 1e9, raw > 0 ? raw / t : 0.0);
    } else {
      std::printf("| %s | %s | %s | %.3f | %.1f GB/s | %.3f |\n", op.c_str(), pass.c_str(), label.c_str(), t * 1e3,
                  info.work / t / 1e9, copy_bw > 0 ? info.work / t / copy_bw : 0.0);
    }
  }
  std::printf("\nGEMM-bound rows: raw cblas_sgemm time of the same GEMMs (OpenBLAS threads = %d) / this time.\n",
              loom::default_execution_context().num_threads());
  std::printf("Memory-bound rows: minimal bytes moved / time, over the copy kernel's bandwidth.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string backend_name = "cpu";
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], "--backend=", 10) == 0)
      backend_name = argv[i] + 10;
    else
      args.push_back(argv[i]);
  }
  int count = static_cast<int>(args.size());
  benchmark::Initialize(&count, args.data());

  loom::Registry registry;
  loom::PluginHost host;
  host.load(loom::PluginHost::default_search_path({{LOOM_PLUGIN_DIR, "benchmarks"}}, {}), registry);
  loom::Value node = loom::Value::map();
  node.set("type", backend_name);
  // The GEMM-bound operations are reported against raw float32 sgemm: float32 products (the cpu
  // backend's default computes them in bf16 where the CPU has AVX512-BF16).
  const loom::ComponentEntry* entry = registry.find("backend", backend_name);
  if (entry && entry->decl.options.find("matmul_precision")) node.set("matmul_precision", "f32");
  loom::Handle<loom::Backend> handle =
      registry.create<loom::Backend>(loom::ComponentRef{"backend", backend_name, node, "backend"});
  backend = handle.get();

  copy_reference();
  for (const Batch& b : batches) register_operations(b);
  register_overhead();
  register_all();

  SummaryReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  print_summary(reporter.seconds(), backend_name);
  benchmark::Shutdown();
  return 0;
}
