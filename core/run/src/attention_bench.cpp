// `loom bench attention`: see attention_bench.hpp for what is measured and how.
#include "loom/run/attention_bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "loom/allocator.hpp"
#include "loom/error.hpp"
#include "loom/tensor.hpp"

namespace loom {

namespace {

using std::int64_t;

// Uniform values in [-1, 1) from a 64-bit xorshift: the bench needs plausible inputs quickly,
// not a statistically perfect stream.
void fill_random(Tensor& t, std::uint64_t seed) {
  std::uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  float* data = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    data[i] = static_cast<float>(static_cast<double>(s >> 40) / static_cast<double>(1ull << 23) - 1.0);
  }
}

std::string label(const ComponentRef& ref) {
  if (!ref.node.is_map() || ref.node.as_map().size() <= 1) return ref.name;
  Value options = ref.node;
  options.erase("type");
  return ref.name + " " + options.to_flow();
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
  const std::size_t n = times.size();
  return n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

void require_positive(int64_t value, const char* what) {
  if (value <= 0) throw UserError(std::string(what) + " must be positive, not " + std::to_string(value));
}

// One problem of one sequence length, shared by every kernel.
struct Problem {
  Tensor qkv, out, lse, dout, dqkv;
  AttentionForwardArgs forward;
  AttentionBackwardArgs backward;
};

Problem make_problem(const AttentionBenchOptions& o, int64_t seq_len) {
  const int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  const int64_t width = o.heads + 2 * kv_heads, d = o.head_dim;
  Problem p;
  p.qkv = Tensor::empty(Shape{o.batch, seq_len, width, d});
  p.out = Tensor::empty(Shape{o.batch, seq_len, o.heads, d});
  p.lse = Tensor::empty(Shape{o.batch, o.heads, seq_len});
  p.dout = Tensor::empty(Shape{o.batch, seq_len, o.heads, d});
  p.dqkv = Tensor::empty(Shape{o.batch, seq_len, width, d});
  fill_random(p.qkv, o.seed * 2 + 1);
  fill_random(p.dout, o.seed * 2 + 2);

  AttentionForwardArgs& a = p.forward;
  a.batch = o.batch;
  a.q_len = a.kv_len = seq_len;
  a.q_heads = o.heads;
  a.kv_heads = kv_heads;
  a.head_dim = d;
  const float* qkv = p.qkv.data<float>();
  const int64_t batch_stride = seq_len * width * d, token_stride = width * d;
  a.q = {qkv, batch_stride, token_stride};
  a.k = {qkv + o.heads * d, batch_stride, token_stride};
  a.v = {qkv + (o.heads + kv_heads) * d, batch_stride, token_stride};
  a.params = o.params;
  if (a.params.scale == 0.0f) a.params.scale = 1.0f / std::sqrt(static_cast<float>(d));
  a.out = p.out.data<float>();
  a.lse = p.lse.data<float>();

  AttentionBackwardArgs& b = p.backward;
  b.forward = &p.forward;
  b.dout = p.dout.data<float>();
  float* dqkv = p.dqkv.data<float>();
  b.dq = {dqkv, batch_stride, token_stride, false};
  b.dk = {dqkv + o.heads * d, batch_stride, token_stride, false};
  b.dv = {dqkv + (o.heads + kv_heads) * d, batch_stride, token_stride, false};
  return p;
}

// The problem's tensors copied into `device`'s memory, the arguments pointing into the copies.
Problem on_device(const Problem& host, const Device& device) {
  Problem p;
  p.qkv = host.qkv.to(device);
  p.out = host.out.to(device);
  p.lse = host.lse.to(device);
  p.dout = host.dout.to(device);
  p.dqkv = host.dqkv.to(device);
  const float* q0 = host.qkv.data<float>();
  const float* qkv = p.qkv.device_data<float>();
  p.forward = host.forward;
  p.forward.q.data = qkv + (host.forward.q.data - q0);
  p.forward.k.data = qkv + (host.forward.k.data - q0);
  p.forward.v.data = qkv + (host.forward.v.data - q0);
  p.forward.out = p.out.device_data<float>();
  p.forward.lse = p.lse.device_data<float>();
  p.backward = host.backward;
  p.backward.dout = p.dout.device_data<float>();
  const float* g0 = host.dqkv.data<float>();
  float* dqkv = p.dqkv.device_data<float>();
  p.backward.dq.data = dqkv + (host.backward.dq.data - g0);
  p.backward.dk.data = dqkv + (host.backward.dk.data - g0);
  p.backward.dv.data = dqkv + (host.backward.dv.data - g0);
  return p;
}

}  // namespace

std::vector<AttentionBenchResult> run_attention_bench(
    const Registry& registry, const AttentionBenchOptions& o,
    const std::function<void(const AttentionBenchResult&)>& progress) {
  if (o.kernels.empty()) throw UserError("no attention kernel to measure: name at least one (--kernels naive,flash)");
  if (o.dtypes.empty()) throw UserError("no compute dtype to measure: name at least one (--dtypes f32,bf16)");
  require_positive(o.batch, "the batch size");
  require_positive(o.heads, "the number of heads");
  require_positive(o.head_dim, "head_dim");
  if (o.repeats < 1) throw UserError("repeats must be at least 1, not " + std::to_string(o.repeats));
  const int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  if (kv_heads < 0 || o.heads % kv_heads != 0)
    throw UserError(std::to_string(o.heads) + " heads are not a multiple of " + std::to_string(kv_heads) +
                    " key/value heads");
  if (o.seq_lens.empty()) throw UserError("no sequence length to measure");
  for (int64_t t : o.seq_lens) require_positive(t, "a sequence length");

  std::vector<Handle<AttentionKernel>> kernels;
  for (const ComponentRef& ref : o.kernels) kernels.push_back(registry.create<AttentionKernel>(ref));

  std::vector<AttentionBenchResult> results;
  for (int64_t seq_len : o.seq_lens) {
    Problem host = make_problem(o, seq_len);
    for (std::size_t k = 0; k < kernels.size(); ++k) {
      AttentionKernel& kernel = *kernels[k];
      // A kernel of another device (cuda-flash on cuda:N) runs on copies of the problem in its
      // device's memory; its launches may return before the device is done, so every timed run
      // ends by copying the log-sum-exp back, which waits for them.
      const Device device = kernel.device();
      std::optional<Problem> copy;
      if (!device.is_host()) copy = on_device(host, device);
      Problem& p = copy ? *copy : host;
      p.backward.forward = &p.forward;  // (the problem has moved since its arguments were made)
      auto wait = [&] {
        if (copy) (void)p.lse.to(Device::host());
      };
      std::vector<float> f32_out;  // the float32 output, to tell whether bf16 changed anything
      auto float32_out = [&]() -> const std::vector<float>& {
        if (f32_out.empty()) {
          p.forward.compute = DType::f32;
          kernel.forward(p.forward);
          f32_out = p.out.to_vector();
        }
        return f32_out;
      };
      for (DType dtype : o.dtypes) {
        AttentionBenchResult r;
        r.kernel = label(o.kernels[k]);
        r.device = device.str();
        r.dtype = dtype;
        r.seq_len = seq_len;
        if (dtype != DType::f32) {
          const std::vector<float>& reference = float32_out();
          p.forward.compute = dtype;
          kernel.forward(p.forward);
          r.fallback = p.out.to_vector() == reference;
        }
        p.forward.compute = dtype;
        auto both = [&] {
          kernel.forward(p.forward);
          kernel.backward(p.backward);
        };
        both();  // warm-up: first-touch pages, the allocator's cache, the thread pool
        wait();
        r.forward_ms = median_ms(o.repeats, [&] {
          kernel.forward(p.forward);
          wait();
        });
        r.forward_backward_ms = median_ms(o.repeats, [&] {
          both();
          wait();
        });
        // The core's allocator sees a host kernel's scratch; a device's is its own pool's.
        r.memory_measured = !copy;
        if (r.memory_measured) {
          const std::size_t before = allocator_stats().bytes_in_use;
          allocator_reset_peak();
          both();
          const std::size_t peak = allocator_stats().peak_bytes_in_use;
          r.peak_extra_bytes = peak > before ? peak - before : 0;
        }
        if (dtype == DType::f32 && f32_out.empty()) f32_out = p.out.to_vector();
        if (progress) progress(r);
        results.push_back(r);
      }
    }
  }
  return results;
}

namespace {

// A row's kernel: its label, where it computed when not on the host, and whether its bf16 was
// its float32.
std::string display_name(const AttentionBenchResult& r) {
  std::string name = r.kernel;
  if (!r.device.empty() && r.device != "host") name += " on " + r.device;
  if (r.fallback) name += " (fallback)";
  return name;
}

}  // namespace

std::string format_attention_bench(const AttentionBenchOptions& o, const std::vector<AttentionBenchResult>& results,
                                   int threads) {
  const int64_t kv_heads = o.kv_heads == 0 ? o.heads : o.kv_heads;
  std::size_t name_width = 6;
  bool any_fallback = false;
  for (const auto& r : results) {
    name_width = std::max(name_width, display_name(r).size());
    any_fallback = any_fallback || r.fallback;
  }
  std::ostringstream s;
  char line[512];
  for (std::size_t first = 0; first < results.size();) {
    std::size_t last = first;
    while (last < results.size() && results[last].seq_len == results[first].seq_len) ++last;
    const AttentionBenchResult& base = results[first];
    s << "seq_len " << base.seq_len << "  (batch " << o.batch << ", heads " << o.heads;
    if (kv_heads != o.heads) s << "/" << kv_heads << " kv";
    s << ", head_dim " << o.head_dim << (o.params.causal ? ", causal" : ", bidirectional");
    if (o.params.window > 0) s << ", window " << o.params.window;
    if (o.params.softcap > 0.0f) s << ", softcap " << o.params.softcap;
    s << ", " << threads << (threads == 1 ? " thread" : " threads") << ", median of " << o.repeats << ")\n";
    std::snprintf(line, sizeof line, "  %-*s %5s %12s %12s %14s %10s %12s %12s %8s\n", static_cast<int>(name_width),
                  "kernel", "dtype", "forward ms", "fwd+bwd ms", "peak extra MiB", "fwd speed", "fwd+bwd speed",
                  "memory", "vs f32");
    s << line;
    for (std::size_t i = first; i < last; ++i) {
      const AttentionBenchResult& r = results[i];
      const double mib = static_cast<double>(r.peak_extra_bytes) / (1024.0 * 1024.0);
      const double memory =
          base.peak_extra_bytes == 0 ? 0.0 : static_cast<double>(r.peak_extra_bytes) / base.peak_extra_bytes;
      char vs_f32[32] = "-";
      for (std::size_t j = first; j < last; ++j)
        if (r.dtype != DType::f32 && results[j].kernel == r.kernel && results[j].dtype == DType::f32)
          std::snprintf(vs_f32, sizeof vs_f32, "%.2fx", results[j].forward_backward_ms / r.forward_backward_ms);
      const std::string name = display_name(r);
      // A device kernel's scratch is not the core's allocator's to measure: "-".
      char mib_text[32] = "-", memory_text[32] = "-";
      if (r.memory_measured) std::snprintf(mib_text, sizeof mib_text, "%.2f", mib);
      if (r.memory_measured && base.memory_measured) std::snprintf(memory_text, sizeof memory_text, "%.3fx", memory);
      std::snprintf(line, sizeof line, "  %-*s %5s %12.2f %12.2f %14s %9.2fx %12.2fx %12s %8s\n",
                    static_cast<int>(name_width), name.c_str(), std::string(dtype_name(r.dtype)).c_str(), r.forward_ms,
                    r.forward_backward_ms, mib_text, base.forward_ms / r.forward_ms,
                    base.forward_backward_ms / r.forward_backward_ms, memory_text, vs_f32);
      s << line;
    }
    s << "\n";
    first = last;
  }
  s << "speed: the first row's time divided by this row's (above 1: faster); memory: this row's peak extra\n"
       "memory divided by the first row's; vs f32: the same kernel's f32 fwd+bwd time divided by this row's.\n";
  if (any_fallback)
    s << "(fallback): the kernel has no bf16 path (or this CPU no AVX512-BF16): its bf16 output is its f32 output,\n"
         "bit for bit.\n";
  return s.str();
}

}  // namespace loom
