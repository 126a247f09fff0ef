// loom_bench_moe: the share of a mixture-of-experts training step spent routing tokens and in the
// experts' matrix products, against a dense llama of the same active parameter count.
//
//   build/bin/loom_bench_moe                        # mixtral-tiny's shape, batch 16 x 128, 9 rounds
//   build/bin/loom_bench_moe --batch 8 --rounds 15 --experts 8 --top-k 2 --width 192
//
// The model is a plugin, so its parts cannot be timed from inside without instrumenting the hot
// path; they are measured by difference instead, with four llama models of one shape (hidden 128,
// 4 layers, 4 heads over 2, the preset's router losses):
//   moe         E experts of width F, k per token (configs/mixtral-tiny.yaml: 8, 192, 2);
//   moe, F = 1  the same routing (router product, softmax, top-k, gathering each expert's tokens,
//               combining the k outputs, auxiliary losses) with experts of width 1;
//   dense       a SwiGLU MLP of width k * F: the same active parameters and FLOPs per token;
//   dense, F=1  everything but the MLP.
//   routing            = moe(F=1) - dense(F=1)
//   expert products    = moe - moe(F=1)     (the experts' three matrix products and SwiGLU)
//   dense MLP          = dense - dense(F=1)
// Each is a share of its own model's step. A step is the forward and backward pass (no
// optimizer). The machine is shared and noisy: every round times one step of each model in a
// rotating order, and each model's figure is the median over the rounds.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/execution.hpp>
#include <loom/kinds/model.hpp>
#include <string>
#include <vector>

namespace {

using loom::Shape;
using loom::Tensor;
using loom::Value;

struct BenchShape {
  std::int64_t experts = 8, top_k = 2, width = 192, batch = 16, seq = 128;
};

Value options(const BenchShape& s, bool moe, std::int64_t width) {
  Value o = Value::map();
  o.set("type", "llama");
  o.set("seq_len", s.seq);
  o.set("hidden_dim", 128);
  o.set("intermediate_dim", width);
  o.set("num_layers", 4);
  o.set("num_heads", 4);
  o.set("num_kv_heads", 2);
  o.set("vocab_size", 256);
  o.set("attention", "flash");
  if (moe) {
    Value m = Value::map();
    m.set("num_experts", s.experts);
    m.set("experts_per_token", s.top_k);
    m.set("router_aux_loss_coef", 0.02);
    m.set("router_z_loss_coef", 0.001);
    o.set("moe", m);
  }
  return o;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  BenchShape s;
  int rounds = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const long long v = std::atoll(argv[i + 1]);
    if (flag == "--batch")
      s.batch = v;
    else if (flag == "--seq")
      s.seq = v;
    else if (flag == "--rounds")
      rounds = static_cast<int>(std::max(1LL, v));
    else if (flag == "--experts")
      s.experts = v;
    else if (flag == "--top-k")
      s.top_k = v;
    else if (flag == "--width")
      s.width = v;
    else {
      std::fprintf(stderr,
                   "usage: loom_bench_moe [--batch N] [--seq N] [--rounds N] [--experts E] [--top-k K] [--width F]\n");
      return 2;
    }
  }
  loom::Registry registry;
  loom::PluginHost().load({{LOOM_PLUGIN_DIR, "bench"}}, registry);
  auto backend = registry.create<loom::Backend>(loom::ComponentRef{"backend", "cpu", Value(), "backend"});

  struct Variant {
    const char* name;
    loom::Handle<loom::Model> model;
    std::vector<double> times;
  };
  std::vector<Variant> variants;
  const auto add = [&](const char* name, bool moe, std::int64_t width) {
    auto model = registry.create<loom::Model>(loom::ComponentRef{"model", "llama", options(s, moe, width), "model"});
    model->build(loom::ModelSetup{0});
    model->initialize(1);
    variants.push_back({name, std::move(model), {}});
  };
  add("moe", true, s.width);
  add("moe F=1", true, 1);
  add("dense", false, s.top_k * s.width);
  add("dense F=1", false, 1);

  std::vector<std::int32_t> t(static_cast<std::size_t>(s.batch * s.seq));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>((i * 7919u) % 256u);
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(t), Shape{s.batch, s.seq});
  const auto step = [&](loom::Model& model) {
    for (const auto& p : model.parameters()) p.parameter->zero_grad();
    loom::Tape tape;
    loom::Ops ops(*backend, &tape);
    const auto t0 = std::chrono::steady_clock::now();
    tape.backward(model.loss(ops, tokens, tokens, Tensor()));
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  for (auto& v : variants) step(*v.model);  // warm-up: gradient buffers, the allocator's cache
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < variants.size(); ++i) {
      Variant& v = variants[(i + static_cast<std::size_t>(r)) % variants.size()];
      v.times.push_back(step(*v.model));
    }

  std::printf("llama, hidden 128, 4 layers; moe: %lld experts of width %lld, %lld per token; dense: width %lld\n",
              static_cast<long long>(s.experts), static_cast<long long>(s.width), static_cast<long long>(s.top_k),
              static_cast<long long>(s.top_k * s.width));
  std::printf("batch %lld x %lld, forward + backward, median of %d alternating rounds, %d threads\n\n",
              static_cast<long long>(s.batch), static_cast<long long>(s.seq), rounds,
              loom::default_execution_context().num_threads());
  std::printf("%-12s %12s %12s %12s\n", "model", "step ms", "min ms", "tokens/s");
  std::vector<double> m;
  for (const auto& v : variants) {
    m.push_back(median(v.times));
    std::printf("%-12s %12.2f %12.2f %12.0f\n", v.name, 1e3 * m.back(),
                1e3 * *std::min_element(v.times.begin(), v.times.end()),
                static_cast<double>(s.batch * s.seq) / m.back());
  }
  const double moe = m[0], moe_f1 = m[1], dense = m[2], dense_f1 = m[3];
  const double routing = moe_f1 - dense_f1, experts = moe - moe_f1, dense_mlp = dense - dense_f1;
  std::printf("\n%-38s %10s %10s\n", "part", "ms", "share");
  std::printf("%-38s %10.2f %9.1f%%\n", "moe: routing (router, top-k, dispatch)", 1e3 * routing, 100 * routing / moe);
  std::printf("%-38s %10.2f %9.1f%%\n", "moe: expert matrix products", 1e3 * experts, 100 * experts / moe);
  std::printf("%-38s %10.2f %9.1f%%\n", "dense: MLP matrix products", 1e3 * dense_mlp, 100 * dense_mlp / dense);
  std::printf("\nmoe step / dense step: %.3f; expert products / dense MLP (same FLOPs): %.3f\n", moe / dense,
              experts / dense_mlp);
  return 0;
}
