// loom_cuda_attention_bench: an attention kernel of a device (attention/cuda-flash) timed on
// operands in that device's memory, forward and forward+backward, for the device check
// (benchmarks/cuda/device_check.sh), which compares it with PyTorch's scaled_dot_product_attention
// on the same shapes. `loom bench attention` measures on host memory only (it refuses a device's
// kernel), hence this program.
//
//   loom_cuda_attention_bench [--plugin-dir DIR] [--kernels cuda-flash] [--dtypes bf16,f32]
//       [--seq-lens 1024,2048,4096,8192] [--batch 4] [--heads 16] [--kv-heads 0] [--head-dim 64]
//       [--bidirectional] [--repeats 10]
//
// The problem is `loom bench attention`'s: q, k, v as slices of one fused
// [batch, seq, heads + 2 kv_heads, head_dim] buffer, gradients into one fused buffer, causal
// unless --bidirectional. Each timed run ends with a one-element copy to the host (which waits for
// the kernels' stream), so a time includes that copy's latency (microseconds). One line per
// (kernel, dtype, seq_len):
//   kernel cuda-flash dtype bf16 seq 1024 batch 4 heads 16/16 head_dim 64 causal 1 fwd_ms F fwdbwd_ms B
//   fwd_tflops X fwdbwd_tflops Y
// FLOPs as FlashAttention's benchmarks count them: 4 b h s^2 d forward (halved when causal),
// 2.5 times that backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/error.hpp>
#include <loom/execution.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/backend.hpp>
#include <loom/random.hpp>
#include <loom/tensor.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using loom::Tensor;
using std::int64_t;

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

Tensor random_on(const loom::Shape& shape, std::uint64_t key, const loom::Device& device) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = loom::random_normal(key, static_cast<std::uint32_t>(i));
  return t.to(device);
}

template <class F>
double median_ms(int repeats, F&& run) {
  std::vector<double> times;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int run(int argc, char** argv) {
  std::string plugin_dir = LOOM_PLUGIN_DIR, kernels = "cuda-flash", dtypes = "bf16,f32",
              seq_lens = "1024,2048,4096,8192";
  int64_t batch = 4, heads = 16, kv_heads = 0, head_dim = 64;
  int repeats = 10;
  bool causal = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw loom::UserError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--plugin-dir")
      plugin_dir = next();
    else if (arg == "--kernels")
      kernels = next();
    else if (arg == "--dtypes")
      dtypes = next();
    else if (arg == "--seq-lens")
      seq_lens = next();
    else if (arg == "--batch")
      batch = std::stoll(next());
    else if (arg == "--heads")
      heads = std::stoll(next());
    else if (arg == "--kv-heads")
      kv_heads = std::stoll(next());
    else if (arg == "--head-dim")
      head_dim = std::stoll(next());
    else if (arg == "--repeats")
      repeats = std::stoi(next());
    else if (arg == "--bidirectional")
      causal = false;
    else
      throw loom::UserError("unknown argument " + arg + " (see the comment at the top of attention_bench.cpp)");
  }
  if (kv_heads == 0) kv_heads = heads;

  auto execution = loom::make_execution_context(1);
  loom::Registry registry;
  registry.set_execution_context(execution.get());
  loom::PluginHost host;
  host.load({{plugin_dir, "the build's plugins"}}, registry);

  for (const std::string& name : split(kernels)) {
    const loom::Handle<loom::AttentionKernel> kernel =
        registry.create<loom::AttentionKernel>(loom::ComponentRef{"attention", name, loom::Value(name), "--kernels"});
    const loom::Device device = kernel->device();
    for (const std::string& seq_text : split(seq_lens)) {
      const int64_t seq = std::stoll(seq_text), width = heads + 2 * kv_heads, d = head_dim;
      const Tensor qkv = random_on(loom::Shape{batch, seq, width, d}, 1, device);
      const Tensor dout = random_on(loom::Shape{batch, seq, heads, d}, 2, device);
      const Tensor out = Tensor::empty(loom::Shape{batch, seq, heads, d}, loom::DType::f32, device);
      const Tensor lse = Tensor::empty(loom::Shape{batch, heads, seq}, loom::DType::f32, device);
      const Tensor dqkv = Tensor::empty(loom::Shape{batch, seq, width, d}, loom::DType::f32, device);
      const Tensor tick = lse.view(loom::Shape{batch * heads * seq}).slice(0, 0, 1);
      const float* base = qkv.device_data<float>();
      float* grads = dqkv.device_data<float>();
      loom::AttentionForwardArgs a;
      a.batch = batch;
      a.q_len = a.kv_len = seq;
      a.q_heads = heads;
      a.kv_heads = kv_heads;
      a.head_dim = d;
      a.q = {base, seq * width * d, width * d};
      a.k = {base + heads * d, seq * width * d, width * d};
      a.v = {base + (heads + kv_heads) * d, seq * width * d, width * d};
      a.params.causal = causal;
      a.params.scale = 1.0f / std::sqrt(static_cast<float>(d));
      a.out = out.device_data<float>();
      a.lse = lse.device_data<float>();
      loom::AttentionBackwardArgs b;
      b.forward = &a;
      b.dout = dout.device_data<float>();
      b.dq = {grads, seq * width * d, width * d, false};
      b.dk = {grads + heads * d, seq * width * d, width * d, false};
      b.dv = {grads + (heads + kv_heads) * d, seq * width * d, width * d, false};
      for (const std::string& dtype : split(dtypes)) {
        a.compute = dtype == "bf16" ? loom::DType::bf16 : loom::DType::f32;
        auto wait = [&] { (void)tick.to(loom::Device::host()); };
        kernel->forward(a);  // warm-up
        kernel->backward(b);
        wait();
        const double fwd = median_ms(repeats, [&] {
          kernel->forward(a);
          wait();
        });
        const double both = median_ms(repeats, [&] {
          kernel->forward(a);
          kernel->backward(b);
          wait();
        });
        const double flops = 4.0 * static_cast<double>(batch * heads) * static_cast<double>(seq) *
                             static_cast<double>(seq) * static_cast<double>(d) * (causal ? 0.5 : 1.0);
        std::printf(
            "kernel %s dtype %s seq %lld batch %lld heads %lld/%lld head_dim %lld causal %d fwd_ms %.3f fwdbwd_ms "
            "%.3f fwd_tflops %.2f fwdbwd_tflops %.2f\n",
            name.c_str(), dtype.c_str(), static_cast<long long>(seq), static_cast<long long>(batch),
            static_cast<long long>(heads), static_cast<long long>(kv_heads), static_cast<long long>(d), causal ? 1 : 0,
            fwd, both, flops / fwd / 1e9, 3.5 * flops / both / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::UserError& e) {
    std::cerr << "loom_cuda_attention_bench: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom_cuda_attention_bench: internal error: " << e.what() << "\n";
    return 1;
  }
}
