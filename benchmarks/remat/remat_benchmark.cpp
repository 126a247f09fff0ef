// loom_bench_remat: what activation checkpointing (model.remat) saves and costs, every policy
// measured in one run on the same model, data and thread count.
//
//   build/bin/loom_bench_remat                      # gpt2-small, batch 4 x 1024, 3 timed steps
//   build/bin/loom_bench_remat --batch 2 --seq 512 --steps 5 --model llama
//
// Per policy (none, full, save_dots), after one warm-up step:
//   activations  bytes the allocator holds after the forward pass beyond what it held before
//                it (what the tape keeps for the backward pass), less the gradients
//                linear_cross_entropy computes during the forward pass (dW [vocab, C] and
//                dx [tokens, C], held alike by every policy);
//   peak         the allocator's peak during the step beyond that same baseline;
//   step         the median wall time of a training step (forward and backward, no optimizer).
// Ratios are against none from the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <loom/allocator.hpp>
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

struct Result {
  double activations_mib = 0, peak_mib = 0, step_seconds = 0;
};

Value model_options(const std::string& type, std::int64_t seq, const std::string& remat) {
  Value o = Value::map();
  o.set("type", type);
  o.set("seq_len", seq);
  o.set("attention", "flash");
  o.set("remat", remat);
  o.set("vocab_size", 50257);
  if (type == "gpt2") {  // GPT-2 small
    o.set("hidden_dim", 768);
    o.set("num_layers", 12);
    o.set("num_heads", 12);
  } else {  // the same widths as a llama / gemma
    o.set("hidden_dim", 768);
    o.set("intermediate_dim", 2048);
    o.set("num_layers", 12);
    o.set("num_heads", 12);
    o.set("num_kv_heads", 4);
    if (type == "gemma") o.set("head_dim", 64);
  }
  return o;
}

Result measure(loom::Registry& registry, loom::Backend& backend, const std::string& type, std::int64_t batch,
               std::int64_t seq, int steps, const std::string& remat) {
  auto model =
      registry.create<loom::Model>(loom::ComponentRef{"model", type, model_options(type, seq, remat), "model"});
  model->build(loom::ModelSetup{0});
  model->initialize(1);
  std::vector<std::int32_t> t(static_cast<std::size_t>(batch * seq));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>((i * 7919u) % 50257u);
  const Tensor tokens = Tensor::from(std::span<const std::int32_t>(t), Shape{batch, seq});
  Result r;
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    for (const auto& p : model->parameters()) p.parameter->zero_grad();
    loom::Tape tape;
    loom::Ops ops(backend, &tape);
    const std::size_t before = loom::allocator_stats().bytes_in_use;
    loom::allocator_reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor loss = model->loss(ops, tokens, tokens, Tensor());
    const std::size_t head = static_cast<std::size_t>((50257 + batch * seq) * 768) * sizeof(float);
    const std::size_t held = loom::allocator_stats().bytes_in_use - before - head;
    tape.backward(loss);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::size_t peak = loom::allocator_stats().peak_bytes_in_use - before;
    if (s == 0) continue;  // warm-up: gradient buffers and the allocator's cache
    times.push_back(dt);
    r.activations_mib = static_cast<double>(held) / (1 << 20);
    r.peak_mib = static_cast<double>(peak) / (1 << 20);
  }
  std::sort(times.begin(), times.end());
  r.step_seconds = times[times.size() / 2];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string type = "gpt2";
  std::int64_t batch = 4, seq = 1024;
  int steps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model")
      type = argv[i + 1];
    else if (flag == "--batch")
      batch = std::atoll(argv[i + 1]);
    else if (flag == "--seq")
      seq = std::atoll(argv[i + 1]);
    else if (flag == "--steps")
      steps = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "usage: loom_bench_remat [--model gpt2|llama|gemma] [--batch N] [--seq N] [--steps N]\n");
      return 2;
    }
  }
  loom::Registry registry;
  loom::PluginHost().load({{LOOM_PLUGIN_DIR, "bench"}}, registry);
  auto backend = registry.create<loom::Backend>(loom::ComponentRef{"backend", "cpu", Value(), "backend"});
  std::printf("model %s, batch %lld x %lld, %d timed steps, %d threads\n", type.c_str(), static_cast<long long>(batch),
              static_cast<long long>(seq), steps, loom::default_execution_context().num_threads());
  std::printf("%-10s %16s %10s %12s %10s %10s %8s\n", "remat", "activations MiB", "ratio", "peak MiB", "ratio",
              "step s", "ratio");
  Result none;
  for (const char* policy : {"none", "full", "save_dots"}) {
    const Result r = measure(registry, *backend, type, batch, seq, steps, policy);
    if (std::strcmp(policy, "none") == 0) none = r;
    std::printf("%-10s %16.1f %10.3f %12.1f %10.3f %10.3f %8.3f\n", policy, r.activations_mib,
                r.activations_mib / none.activations_mib, r.peak_mib, r.peak_mib / none.peak_mib, r.step_seconds,
                r.step_seconds / none.step_seconds);
    std::fflush(stdout);
  }
  return 0;
}
