// Conformance of every registered attention kernel (kinds/attention.hpp).
//
// Every `attention` component the build's plugins register is run over random shapes (odd
// lengths, head_dim 7/16/64, q_len < kv_len as with a KV cache), masks (causal or not, sliding
// windows), soft-caps, head groupings (MHA, GQA, MQA), segment ids (rows with no visible key
// included) and strided operands (heads padded, or q/k/v slices of one fused qkv), and compared
// with `naive` for the output, the log-sum-exp and the gradients of q, k and v. `naive` itself
// is checked against a float64 implementation of the contract's formula written here, and its
// gradients against finite differences, through Ops::attention on the `reference` backend.
//
// Each kernel also runs with every integer option at its declared minimum (for tiled kernels:
// the smallest tiles, so that short test sequences still cross many tile boundaries).
//
// Mixed precision: every kernel also runs every case with AttentionForwardArgs::compute = bf16
// and is compared with naive's float32 result within bf16 rounding (see bf16_tolerance below); a
// kernel without a bf16 path computes float32 and passes trivially. `flash` has one on CPUs with
// AVX512-BF16, and is checked to round its tile operands to nearest-even bf16 (exact values on a
// problem built for it) and to change its results against float32 (rounding happened), while its
// float32 results stay the float32 path's, unaffected by bf16 calls on the same kernel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/error.hpp>
#include <loom/execution.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/backend.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "conformance_setup.hpp"

namespace {

using loom::AttentionForwardArgs;
using loom::AttentionKernel;
using loom::Tensor;
using std::int64_t;

constexpr float negative_infinity = -std::numeric_limits<float>::infinity();

loom::Registry& registry() {
  static loom::Registry* r = [] {
    auto* reg = new loom::Registry;
    static auto context = loom::make_execution_context(2);
    reg->set_execution_context(context.get());
    loom::PluginHost host;
    host.load(loom::conformance::plugins(), *reg);
    return reg;
  }();
  return *r;
}

loom::Handle<AttentionKernel> make_kernel(const std::string& name, loom::Value node = loom::Value()) {
  return registry().create<AttentionKernel>(loom::ComponentRef{"attention", name, std::move(node), "attention"});
}

// The kernels under test: every registered one with its defaults, and with every integer option
// at its declared minimum. A kernel of another device than the host (cuda-flash on cuda:N) runs
// the same problems on copies of the operands in its device's memory (run() below); one whose
// device this machine lacks is skipped.
struct KernelVariant {
  std::string label;
  std::string name;
  loom::Value node;
};
// Kernels whose device this machine lacks (their creation throws DeviceUnavailable: cuda-flash
// without a GPU): "name: why", skipped, not failed.
std::vector<std::string>& unavailable_kernels() {
  static std::vector<std::string> names;
  return names;
}
std::vector<KernelVariant> kernel_variants() {
  std::vector<KernelVariant> variants;
  unavailable_kernels().clear();
  for (const loom::ComponentEntry* entry : registry().list("attention")) {
    try {
      make_kernel(entry->decl.name);
    } catch (const loom::DeviceUnavailable& e) {
      unavailable_kernels().push_back(entry->decl.name + ": " + e.what());
      continue;
    }
    variants.push_back({entry->decl.name, entry->decl.name, loom::Value()});
    loom::Value node = loom::Value::map();
    node.set("type", loom::Value(entry->decl.name));
    std::string label = entry->decl.name;
    bool any = false;
    for (const loom::OptionSpec& spec : entry->decl.options.options()) {
      if (spec.type() != loom::OptionType::integer || !spec.min_value()) continue;
      const auto least = static_cast<int64_t>(std::ceil(*spec.min_value() + (spec.min_inclusive() ? 0.0 : 1.0)));
      node.set(spec.name(), loom::Value(least));
      label += " " + spec.name() + "=" + std::to_string(least);
      any = true;
    }
    if (any) variants.push_back({label, entry->decl.name, node});
  }
  return variants;
}

// Under `loom conformance PLUGIN`, when the plugin's kernel cannot run here (no GPU for
// cuda-flash): why, so that every case skips, as the backend suites do. Nullopt in loom's own
// build (the host kernels are tested whatever device is missing; DeviceKernelsRunOnTheirDevice
// says which were skipped).
std::optional<std::string> subject_unavailable() {
  kernel_variants();
  if (loom::conformance::setup().subject.empty() || unavailable_kernels().empty()) return std::nullopt;
  std::string why = "the attention kernel under test cannot run on this machine:";
  for (const std::string& u : unavailable_kernels()) why += " " + u;
  return why;
}

// ---------------------------------------------------------------------------------------------
// A problem: shapes, options, and inputs laid out with padding so that every operand is strided.

struct Case {
  int64_t batch = 1, q_len = 1, kv_len = 1, q_heads = 1, kv_heads = 1, head_dim = 1;
  bool causal = true;
  int64_t window = 0;
  float softcap = 0.0f;
  bool segments = false;
  bool fused = false;  // q, k, v are slices of one [batch, len, q_heads + 2 kv_heads + 1, head_dim]

  std::string str() const {
    std::ostringstream s;
    s << "batch " << batch << ", q_len " << q_len << ", kv_len " << kv_len << ", heads " << q_heads << "/" << kv_heads
      << ", head_dim " << head_dim << (causal ? ", causal" : ", bidirectional") << ", window " << window << ", softcap "
      << softcap << (segments ? ", segments" : "") << (fused ? ", fused qkv" : "");
    return s.str();
  }
};

struct Problem {
  Case c;
  std::vector<float> q_buf, kv_buf;  // padded storage
  int64_t q_token_stride = 0, q_batch_stride = 0, kv_token_stride = 0, kv_batch_stride = 0;
  int64_t k_offset = 0, v_offset = 0;  // element offsets of k and v heads within kv_buf tokens
  std::vector<std::int32_t> q_seg, kv_seg;
  std::vector<float> dout;
  AttentionForwardArgs args;  // out and lse to be filled per run
};

Problem make_problem(const Case& c, std::mt19937& rng) {
  Problem p;
  p.c = c;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t d = c.head_dim;
  if (c.fused) {  // one buffer, q | k | v | one padding head per token
    const int64_t heads = c.q_heads + 2 * c.kv_heads + 1;
    p.q_token_stride = p.kv_token_stride = heads * d;
    p.q_batch_stride = p.kv_batch_stride = c.kv_len * heads * d;
    p.q_buf.resize(static_cast<size_t>(c.batch * p.q_batch_stride));
    for (float& x : p.q_buf) x = normal(rng);
    p.k_offset = c.q_heads * d;
    p.v_offset = (c.q_heads + c.kv_heads) * d;
  } else {  // q with one padding head; k | padding | v with padding
    p.q_token_stride = (c.q_heads + 1) * d;
    p.q_batch_stride = c.q_len * p.q_token_stride + 3;
    p.kv_token_stride = (2 * c.kv_heads + 2) * d;
    p.kv_batch_stride = c.kv_len * p.kv_token_stride + 5;
    p.q_buf.resize(static_cast<size_t>(c.batch * p.q_batch_stride));
    p.kv_buf.resize(static_cast<size_t>(c.batch * p.kv_batch_stride));
    for (float& x : p.q_buf) x = normal(rng);
    for (float& x : p.kv_buf) x = normal(rng);
    p.k_offset = 0;
    p.v_offset = (c.kv_heads + 1) * d;
  }
  if (c.segments) {
    // Packed documents: random boundaries, the same ids for the keys as for the queries they
    // are (the last q_len keys), and a few query rows whose id no key has (no visible key).
    std::uniform_int_distribution<int> boundary(0, 5);
    p.kv_seg.resize(static_cast<size_t>(c.batch * c.kv_len));
    p.q_seg.resize(static_cast<size_t>(c.batch * c.q_len));
    for (int64_t b = 0; b < c.batch; ++b) {
      std::int32_t id = 0;
      for (int64_t j = 0; j < c.kv_len; ++j) {
        if (j > 0 && boundary(rng) == 0) ++id;
        p.kv_seg[static_cast<size_t>(b * c.kv_len + j)] = id;
      }
      for (int64_t i = 0; i < c.q_len; ++i) {
        std::int32_t s = p.kv_seg[static_cast<size_t>(b * c.kv_len + c.kv_len - c.q_len + i)];
        if (boundary(rng) == 0 && boundary(rng) < 2) s = 1000;  // no key has it
        p.q_seg[static_cast<size_t>(b * c.q_len + i)] = s;
      }
    }
  }
  p.dout.resize(static_cast<size_t>(c.batch * c.q_len * c.q_heads * d));
  for (float& x : p.dout) x = normal(rng);

  AttentionForwardArgs& a = p.args;
  a.batch = c.batch;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.q_heads = c.q_heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = d;
  const float* kv = c.fused ? p.q_buf.data() : p.kv_buf.data();
  // In a fused buffer the queries are the last q_len tokens (q_len == kv_len there).
  a.q = {p.q_buf.data(), p.q_batch_stride, p.q_token_stride};
  a.k = {kv + p.k_offset, p.kv_batch_stride, p.kv_token_stride};
  a.v = {kv + p.v_offset, p.kv_batch_stride, p.kv_token_stride};
  a.q_segments = c.segments ? p.q_seg.data() : nullptr;
  a.kv_segments = c.segments ? p.kv_seg.data() : nullptr;
  a.params.causal = c.causal;
  a.params.window = c.window;
  a.params.softcap = c.softcap;
  a.params.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return p;
}

// Compact copies of one run's results: out [b, i, h, e], lse [b, h, i], dq like q, dk/dv like k.
struct Results {
  std::vector<float> out, lse, dq, dk, dv;
};

// Copies the [batch, len, heads, head_dim] view at `data` into a compact vector.
std::vector<float> gather(const float* data, int64_t batch_stride, int64_t token_stride, int64_t batch, int64_t len,
                          int64_t heads, int64_t head_dim) {
  std::vector<float> r;
  r.reserve(static_cast<size_t>(batch * len * heads * head_dim));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < len; ++t)
      for (int64_t e = 0; e < heads * head_dim; ++e) r.push_back(data[b * batch_stride + t * token_stride + e]);
  return r;
}

// Runs `kernel` forward and backward on `p`. Gradients land in buffers of the inputs' padded
// layouts, pre-filled with `prior` values when `accumulate` (then subtracted again), and the
// padding is checked to be untouched.
// A device kernel's copies of the host buffers of one run: each buffer copied to the kernel's
// device, pointers into it translated, and results copied back.
class DeviceCopies {
 public:
  explicit DeviceCopies(loom::Device device) : device_(device) {}
  bool active() const { return !device_.is_host(); }
  // The device copy of `host` (n elements), and where `at` (a pointer into host) lies in it.
  template <class T>
  T* copy_in(const T* host, size_t n, const T* at) {
    if (!active() || host == nullptr) return const_cast<T*>(at);
    Tensor h = Tensor::empty(loom::Shape{static_cast<int64_t>(std::max<size_t>(n, 1))}, loom::dtype_of<T>());
    std::memcpy(h.data<T>(), host, n * sizeof(T));
    copies_.push_back({h.to(device_), const_cast<T*>(host), n * sizeof(T)});
    return copies_.back().device.template device_data<T>() + (at - host);
  }
  // Every buffer back into its host vector (waits for the device); float32 buffers only.
  void copy_out() {
    for (const Copy& c : copies_) {
      const Tensor h = c.device.to(loom::Device::host());
      std::memcpy(c.host, h.data<float>(), c.bytes);  // outputs are float32
    }
  }

 private:
  struct Copy {
    Tensor device;
    void* host;
    size_t bytes;
  };
  loom::Device device_;
  std::vector<Copy> copies_;
};

Results run(AttentionKernel& kernel, const Problem& p, bool accumulate = false, bool only_dv = false) {
  const Case& c = p.c;
  const int64_t d = c.head_dim;
  Results r;
  r.out.assign(static_cast<size_t>(c.batch * c.q_len * c.q_heads * d), std::nanf(""));
  r.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), std::nanf(""));
  AttentionForwardArgs a = p.args;
  DeviceCopies inputs(kernel.device()), outputs(kernel.device());
  a.q.data = inputs.copy_in(p.q_buf.data(), p.q_buf.size(), a.q.data);
  const std::vector<float>& kv = c.fused ? p.q_buf : p.kv_buf;
  a.k.data = inputs.copy_in(kv.data(), kv.size(), a.k.data);
  a.v.data = inputs.copy_in(kv.data(), kv.size(), a.v.data);
  a.q_segments = inputs.copy_in(a.q_segments, p.q_seg.size(), a.q_segments);
  a.kv_segments = inputs.copy_in(a.kv_segments, p.kv_seg.size(), a.kv_segments);
  a.out = outputs.copy_in(r.out.data(), r.out.size(), r.out.data());
  a.lse = outputs.copy_in(r.lse.data(), r.lse.size(), r.lse.data());
  kernel.forward(a);
  outputs.copy_out();

  // Gradient buffers shaped like the inputs' storage; padding and (without accumulate) the
  // destinations hold a sentinel that must be overwritten, or kept where it is padding.
  constexpr float sentinel = 12345.0f;
  std::vector<float> gq(p.q_buf.size(), sentinel), gkv(p.kv_buf.size(), sentinel);
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> prior(-1.0f, 1.0f);
  if (accumulate) {
    for (float& x : gq) x = prior(rng);
    for (float& x : gkv) x = prior(rng);
  }
  const std::vector<float> gq0 = gq, gkv0 = gkv;
  float* kv_grad = c.fused ? gq.data() : gkv.data();
  loom::AttentionBackwardArgs b;
  b.forward = &a;
  b.dout = inputs.copy_in(p.dout.data(), p.dout.size(), p.dout.data());
  DeviceCopies grads(kernel.device());
  float* dq_base = grads.copy_in(gq.data(), gq.size(), gq.data());
  float* kv_grad_base = c.fused ? dq_base : grads.copy_in(gkv.data(), gkv.size(), gkv.data());
  if (!only_dv) {
    b.dq = {dq_base, p.q_batch_stride, p.q_token_stride, accumulate};
    b.dk = {kv_grad_base + p.k_offset, p.kv_batch_stride, p.kv_token_stride, accumulate};
  }
  b.dv = {kv_grad_base + p.v_offset, p.kv_batch_stride, p.kv_token_stride, accumulate};
  kernel.backward(b);
  grads.copy_out();

  auto take = [&](const float* base, const float* base0, int64_t offset, int64_t batch_stride, int64_t token_stride,
                  int64_t len, int64_t heads) {
    std::vector<float> g = gather(base + offset, batch_stride, token_stride, c.batch, len, heads, d);
    if (accumulate) {
      const std::vector<float> g0 = gather(base0 + offset, batch_stride, token_stride, c.batch, len, heads, d);
      for (size_t i = 0; i < g.size(); ++i) g[i] -= g0[i];
    }
    return g;
  };
  r.dq = take(gq.data(), gq0.data(), 0, p.q_batch_stride, p.q_token_stride, c.q_len, c.q_heads);
  const float* kv0 = c.fused ? gq0.data() : gkv0.data();
  r.dk = take(kv_grad, kv0, p.k_offset, p.kv_batch_stride, p.kv_token_stride, c.kv_len, c.kv_heads);
  r.dv = take(kv_grad, kv0, p.v_offset, p.kv_batch_stride, p.kv_token_stride, c.kv_len, c.kv_heads);

  // Nothing outside the gradients' own elements changed.
  auto mark = [&](std::vector<bool>& touched, int64_t offset, int64_t batch_stride, int64_t token_stride, int64_t len,
                  int64_t heads) {
    for (int64_t bb = 0; bb < c.batch; ++bb)
      for (int64_t t = 0; t < len; ++t)
        for (int64_t e = 0; e < heads * d; ++e)
          touched[static_cast<size_t>(offset + bb * batch_stride + t * token_stride + e)] = true;
  };
  std::vector<bool> q_touched(gq.size()), kv_touched(gkv.size());
  mark(q_touched, 0, p.q_batch_stride, p.q_token_stride, c.q_len, c.q_heads);
  std::vector<bool>& kvt = c.fused ? q_touched : kv_touched;
  mark(kvt, p.k_offset, p.kv_batch_stride, p.kv_token_stride, c.kv_len, c.kv_heads);
  mark(kvt, p.v_offset, p.kv_batch_stride, p.kv_token_stride, c.kv_len, c.kv_heads);
  for (size_t i = 0; i < gq.size(); ++i)
    if (!q_touched[i]) {
      EXPECT_EQ(gq[i], gq0[i]) << "dq wrote padding at element " << i;
    }
  for (size_t i = 0; i < gkv.size(); ++i)
    if (!kv_touched[i]) {
      EXPECT_EQ(gkv[i], gkv0[i]) << "dk/dv wrote padding at element " << i;
    }
  return r;
}

// Largest |a - b| relative to the largest |b| (the scale of the result; at least 0.1, since
// inputs and output gradients are of order 1 and a gradient that cancels to zero exactly, as
// with a single visible key, leaves float32 rounding of order 1e-7), with -inf entries required
// to match exactly. Returns +inf on a NaN or a mismatched infinity.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0.1, worst = 0.0;
  for (float x : b)
    if (std::isfinite(x)) scale = std::max(scale, std::fabs(double{x}));
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(a[i]) || std::isnan(b[i])) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, std::fabs(double{a[i]} - double{b[i]}) / scale);
  }
  return worst;
}

// ---------------------------------------------------------------------------------------------
// The contract's formula in float64, independent of any kernel: the oracle for `naive`.

bool visible(const Problem& p, int64_t b, int64_t i, int64_t j) {
  const Case& c = p.c;
  const int64_t pos = c.kv_len - c.q_len + i;
  if (c.causal && j > pos) return false;
  if (c.window > 0 && pos - j >= c.window) return false;
  if (c.window > 0 && !c.causal && j - pos >= c.window) return false;
  if (c.segments && p.q_seg[static_cast<size_t>(b * c.q_len + i)] != p.kv_seg[static_cast<size_t>(b * c.kv_len + j)])
    return false;
  return true;
}

Results float64_reference(const Problem& p) {
  const Case& c = p.c;
  const AttentionForwardArgs& a = p.args;
  const int64_t d = c.head_dim, group = c.q_heads / c.kv_heads;
  Results r;
  r.out.assign(static_cast<size_t>(c.batch * c.q_len * c.q_heads * d), 0.0f);
  r.lse.assign(static_cast<size_t>(c.batch * c.q_heads * c.q_len), 0.0f);
  std::vector<double> dq(r.out.size(), 0.0), dk(static_cast<size_t>(c.batch * c.kv_len * c.kv_heads * d), 0.0),
      dv(dk.size(), 0.0);
  auto at = [](const loom::AttentionOperand& x, int64_t b, int64_t t, int64_t h, int64_t e, int64_t dim) {
    return double{x.data[b * x.batch_stride + t * x.token_stride + h * dim + e]};
  };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.q_heads; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < c.q_len; ++i) {
        std::vector<double> s(static_cast<size_t>(c.kv_len)), raw(s.size()), prob(s.size(), 0.0);
        double max = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < c.kv_len; ++j) {
          double dot = 0.0;
          for (int64_t e = 0; e < d; ++e) dot += at(a.q, b, i, h, e, d) * at(a.k, b, j, g, e, d);
          raw[static_cast<size_t>(j)] = a.params.scale * dot;
          double v = raw[static_cast<size_t>(j)];
          if (c.softcap > 0.0f) v = c.softcap * std::tanh(v / c.softcap);
          s[static_cast<size_t>(j)] = v;
          if (visible(p, b, i, j)) max = std::max(max, v);
        }
        const size_t lse_index = static_cast<size_t>((b * c.q_heads + h) * c.q_len + i);
        const size_t row = static_cast<size_t>(((b * c.q_len + i) * c.q_heads + h) * d);
        if (max == -std::numeric_limits<double>::infinity()) {
          r.lse[lse_index] = negative_infinity;
          continue;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < c.kv_len; ++j)
          if (visible(p, b, i, j)) sum += std::exp(s[static_cast<size_t>(j)] - max);
        const double lse = max + std::log(sum);
        r.lse[lse_index] = static_cast<float>(lse);
        std::vector<double> o(static_cast<size_t>(d), 0.0);
        for (int64_t j = 0; j < c.kv_len; ++j) {
          if (!visible(p, b, i, j)) continue;
          prob[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - lse);
          for (int64_t e = 0; e < d; ++e)
            o[static_cast<size_t>(e)] += prob[static_cast<size_t>(j)] * at(a.v, b, j, g, e, d);
        }
        for (int64_t e = 0; e < d; ++e)
          r.out[row + static_cast<size_t>(e)] = static_cast<float>(o[static_cast<size_t>(e)]);
        // Backward for this row: dP_j = dO . v_j, dS_j = P_j (dP_j - sum_l P_l dP_l), through the cap.
        std::vector<double> dp(prob.size(), 0.0);
        double delta = 0.0;
        for (int64_t j = 0; j < c.kv_len; ++j) {
          if (!visible(p, b, i, j)) continue;
          for (int64_t e = 0; e < d; ++e)
            dp[static_cast<size_t>(j)] += double{p.dout[row + static_cast<size_t>(e)]} * at(a.v, b, j, g, e, d);
          delta += prob[static_cast<size_t>(j)] * dp[static_cast<size_t>(j)];
        }
        for (int64_t j = 0; j < c.kv_len; ++j) {
          const size_t js = static_cast<size_t>(j);
          if (!visible(p, b, i, j)) continue;
          double ds = prob[js] * (dp[js] - delta);
          if (c.softcap > 0.0f) {
            const double t = std::tanh(raw[js] / c.softcap);
            ds *= 1.0 - t * t;
          }
          const size_t krow = static_cast<size_t>(((b * c.kv_len + j) * c.kv_heads + g) * d);
          for (int64_t e = 0; e < d; ++e) {
            const size_t es = static_cast<size_t>(e);
            dq[row + es] += a.params.scale * ds * at(a.k, b, j, g, e, d);
            dk[krow + es] += a.params.scale * ds * at(a.q, b, i, h, e, d);
            dv[krow + es] += prob[js] * double{p.dout[row + es]};
          }
        }
      }
    }
  r.dq.assign(dq.begin(), dq.end());
  r.dk.assign(dk.begin(), dk.end());
  r.dv.assign(dv.begin(), dv.end());
  return r;
}

// ---------------------------------------------------------------------------------------------
// Cases: hand-picked corners, then random ones.

std::vector<Case> corner_cases() {
  std::vector<Case> cases;
  Case c;
  c = {2, 9, 9, 4, 4, 16, true, 0, 0.0f, false, false};  // plain causal MHA
  cases.push_back(c);
  c = {1, 13, 13, 3, 3, 7, false, 0, 0.0f, false, false};  // bidirectional, odd head_dim
  cases.push_back(c);
  c = {2, 17, 17, 4, 2, 16, true, 0, 0.0f, false, true};  // GQA, fused qkv
  cases.push_back(c);
  c = {1, 5, 21, 4, 1, 16, true, 0, 0.0f, false, false};  // MQA with a cache (q_len < kv_len)
  cases.push_back(c);
  c = {1, 1, 19, 2, 2, 64, true, 0, 0.0f, false, false};  // one decoding step
  cases.push_back(c);
  c = {2, 23, 23, 2, 2, 16, true, 5, 0.0f, false, false};  // sliding window
  cases.push_back(c);
  c = {1, 19, 19, 2, 1, 7, false, 4, 0.0f, false, false};  // bidirectional window
  cases.push_back(c);
  c = {1, 15, 15, 2, 2, 16, true, 0, 2.0f, false, false};  // soft-cap
  cases.push_back(c);
  c = {2, 29, 29, 4, 2, 16, true, 0, 0.0f, true, false};  // packed documents, some rows see nothing
  cases.push_back(c);
  c = {1, 11, 30, 6, 2, 7, false, 6, 5.0f, true, false};  // everything at once, with a cache
  cases.push_back(c);
  c = {1, 70, 70, 2, 1, 64, true, 0, 0.0f, false, true};  // several tiles of a tiled kernel
  cases.push_back(c);
  c = {2, 0, 6, 2, 2, 16, true, 0, 0.0f, false, false};  // no query at all: dk and dv are zero
  cases.push_back(c);
  return cases;
}

std::vector<Case> random_cases(int count, unsigned seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t head_dims[] = {7, 16, 64, 1, 32};
  std::vector<Case> cases;
  for (int n = 0; n < count; ++n) {
    Case c;
    c.batch = pick(1, 3);
    c.kv_len = pick(1, 90);
    c.q_len = pick(0, 3) == 0 ? pick(1, c.kv_len) : c.kv_len;
    c.kv_heads = pick(1, 3);
    c.q_heads = c.kv_heads * pick(1, 3);
    c.head_dim = head_dims[pick(0, 4)];
    c.causal = pick(0, 3) != 0;
    c.window = pick(0, 2) == 0 ? pick(1, 20) : 0;
    c.softcap = pick(0, 3) == 0 ? 1.0f + static_cast<float>(pick(0, 40)) / 10.0f : 0.0f;
    c.segments = pick(0, 2) == 0;
    c.fused = c.q_len == c.kv_len && pick(0, 1) == 0;
    cases.push_back(c);
  }
  return cases;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases = corner_cases();
  const std::vector<Case> random = random_cases(40, 20240601);
  cases.insert(cases.end(), random.begin(), random.end());
  return cases;
}

// Float32 kernels against each other or the float64 oracle: rounding only.
constexpr double forward_tolerance = 2e-5;
constexpr double gradient_tolerance = 1e-4;

void expect_close(const Results& got, const Results& want, const std::string& what) {
  EXPECT_LE(relative_error(got.out, want.out), forward_tolerance) << "out, " << what;
  EXPECT_LE(relative_error(got.lse, want.lse), forward_tolerance) << "lse, " << what;
  EXPECT_LE(relative_error(got.dq, want.dq), gradient_tolerance) << "dq, " << what;
  EXPECT_LE(relative_error(got.dk, want.dk), gradient_tolerance) << "dk, " << what;
  EXPECT_LE(relative_error(got.dv, want.dv), gradient_tolerance) << "dv, " << what;
}

// bf16 tile products (compute = bf16) against float32. bf16 keeps 8 significant bits, so
// round-to-nearest-even changes an operand by at most u = 2^-9 of its magnitude, and a product
// of two rounded operands by at most 2u of |a b|; the sums accumulate in float32. The rounding
// errors of the d terms of a score are independent and of either sign, so they grow like
// sqrt(d), not d: relative to the scale of the scores (scale * |q| |k| = about 1 here), a score
// moves by a few u, the softmax turns that into the same relative change of P, and out = P V
// adds V's and P's own 2u. The backward chains three products (dP = dO V^T; dS = P (dP - D),
// where D cancels most of dP; dQ = dS K and dK = dS^T Q), each adding a few u of its inputs'
// scale. (D must see dO rounded as dP does: with float32 dO, a row with one visible key, whose
// exact dS is 0, keeps dO's rounding, u |dO| |V|, about 100u of dq's scale in the window-1 case.) Measured on the 52
// cases below (head_dim up to 64; AMD EPYC Zen 5): at most 3.8u for out, 1.8u for lse, 7.3u for dq and dk, 8.5u for dv;
// the limits are 8u for the forward and 16u for the gradients (relative to each result's largest magnitude, as
// relative_error takes it). A wrong mask, a dropped tile, a missing scale or a product in the wrong layout gives errors
// of order 1, and float32 instead of bf16 is caught by the flash tests below.
constexpr double bf16_unit = 1.0 / 512.0;  // u = 2^-9
constexpr double bf16_forward_tolerance = 8 * bf16_unit;
constexpr double bf16_gradient_tolerance = 16 * bf16_unit;

bool cpu_has_bf16() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

// x rounded to bfloat16, nearest even (the model of VCVTNE2PS2BF16 for finite x).
float round_bf16(float x) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &x, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float r = 0.0f;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

// ---------------------------------------------------------------------------------------------

TEST(AttentionConformance, BuildRegistersTheShippedKernels) {
  if (!loom::conformance::setup().subject.empty()) GTEST_SKIP() << "a check of loom's own build";
  std::vector<std::string> names;
  for (const loom::ComponentEntry* e : registry().list("attention")) names.push_back(e->decl.name);
  EXPECT_NE(std::find(names.begin(), names.end(), "naive"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "flash"), names.end());
}

// The kernels of a device this machine lacks are skipped, saying so (cuda-flash without a GPU);
// with the device, they run every case above on copies of the operands in its memory.
TEST(AttentionConformance, DeviceKernelsRunOnTheirDevice) {
  kernel_variants();
  if (!unavailable_kernels().empty()) {
    std::string why;
    for (const std::string& u : unavailable_kernels()) why += (why.empty() ? "" : "; ") + u;
    GTEST_SKIP() << "not run here: " << why;
  }
  for (const KernelVariant& variant : kernel_variants())
    std::cout << "attention kernel " << variant.label << " computes on " << make_kernel(variant.name)->device().str()
              << "\n";
}

TEST(AttentionConformance, NaiveMatchesTheFloat64Formula) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  auto naive = make_kernel("naive");
  std::mt19937 rng(1);
  for (const Case& c : all_cases()) {
    const Problem p = make_problem(c, rng);
    expect_close(run(*naive, p), float64_reference(p), c.str());
  }
}

TEST(AttentionConformance, EveryKernelMatchesNaive) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  auto naive = make_kernel("naive");
  for (const KernelVariant& variant : kernel_variants()) {
    SCOPED_TRACE(variant.label);
    auto kernel = make_kernel(variant.name, variant.node);
    std::mt19937 rng(2);
    double worst[5] = {0, 0, 0, 0, 0};
    for (const Case& c : all_cases()) {
      const Problem p = make_problem(c, rng);
      const Results want = run(*naive, p);
      const Results got = run(*kernel, p);
      expect_close(got, want, c.str());
      const double errors[5] = {relative_error(got.out, want.out), relative_error(got.lse, want.lse),
                                relative_error(got.dq, want.dq), relative_error(got.dk, want.dk),
                                relative_error(got.dv, want.dv)};
      for (int i = 0; i < 5; ++i) worst[i] = std::max(worst[i], errors[i]);
    }
    std::cout << "[ kernel   ] " << variant.label << ": largest relative error out " << worst[0] << ", lse " << worst[1]
              << ", dq " << worst[2] << ", dk " << worst[3] << ", dv " << worst[4] << "\n";
  }
}

TEST(AttentionConformance, EveryKernelAccumulatesIntoGradients) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  auto naive = make_kernel("naive");
  for (const KernelVariant& variant : kernel_variants()) {
    SCOPED_TRACE(variant.label);
    auto kernel = make_kernel(variant.name, variant.node);
    std::mt19937 rng(3);
    for (const Case& c : corner_cases()) {
      const Problem p = make_problem(c, rng);
      expect_close(run(*kernel, p, /*accumulate=*/true), run(*naive, p), c.str());
    }
  }
}

TEST(AttentionConformance, EveryKernelSkipsGradientsNobodyWants) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  for (const KernelVariant& variant : kernel_variants()) {
    SCOPED_TRACE(variant.label);
    auto kernel = make_kernel(variant.name, variant.node);
    std::mt19937 rng(4);
    const Case c{2, 13, 13, 4, 2, 16, true, 0, 0.0f, false, false};
    const Problem p = make_problem(c, rng);
    const Results all = run(*kernel, p);
    // Only dv wanted: dq and dk pointers null, and dv equal to what the full pass gives.
    const Results dv_only = run(*kernel, p, /*accumulate=*/false, /*only_dv=*/true);
    EXPECT_EQ(relative_error(dv_only.dv, all.dv), 0.0);
  }
}

TEST(AttentionConformance, EveryKernelIsDeterministic) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  for (const KernelVariant& variant : kernel_variants())
    for (const loom::DType compute : {loom::DType::f32, loom::DType::bf16}) {
      SCOPED_TRACE(variant.label + (compute == loom::DType::bf16 ? ", compute bf16" : ""));
      auto kernel = make_kernel(variant.name, variant.node);
      std::mt19937 rng(5);
      const Case c{3, 37, 37, 4, 2, 16, true, 0, 0.0f, true, false};
      Problem p = make_problem(c, rng);
      p.args.compute = compute;
      const Results first = run(*kernel, p), second = run(*kernel, p);
      EXPECT_EQ(first.out, second.out);
      EXPECT_EQ(first.dq, second.dq);
      EXPECT_EQ(first.dk, second.dk);
      EXPECT_EQ(first.dv, second.dv);
    }
}

// compute = bf16 on every case (and with accumulate on the corners) against naive's float32
// result, within the bf16 tolerances justified above.
TEST(AttentionConformance, EveryKernelInBf16StaysWithinBf16RoundingOfFloat32) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  auto naive = make_kernel("naive");
  for (const KernelVariant& variant : kernel_variants()) {
    SCOPED_TRACE(variant.label + ", compute bf16");
    auto kernel = make_kernel(variant.name, variant.node);
    std::mt19937 rng(8);
    double worst[5] = {0, 0, 0, 0, 0};
    const std::vector<Case> cases = all_cases();
    for (std::size_t n = 0; n < cases.size(); ++n) {
      const Case& c = cases[n];
      Problem p = make_problem(c, rng);
      const Results want = run(*naive, p);
      p.args.compute = loom::DType::bf16;
      const Results got = run(*kernel, p, /*accumulate=*/n < corner_cases().size());
      const double errors[5] = {relative_error(got.out, want.out), relative_error(got.lse, want.lse),
                                relative_error(got.dq, want.dq), relative_error(got.dk, want.dk),
                                relative_error(got.dv, want.dv)};
      EXPECT_LE(errors[0], bf16_forward_tolerance) << "out, " << c.str();
      EXPECT_LE(errors[1], bf16_forward_tolerance) << "lse, " << c.str();
      EXPECT_LE(errors[2], bf16_gradient_tolerance) << "dq, " << c.str();
      EXPECT_LE(errors[3], bf16_gradient_tolerance) << "dk, " << c.str();
      EXPECT_LE(errors[4], bf16_gradient_tolerance) << "dv, " << c.str();
      for (int i = 0; i < 5; ++i) worst[i] = std::max(worst[i], errors[i]);
    }
    std::cout << "[ bf16     ] " << variant.label << ": largest relative error against float32 (in u = 2^-9) out "
              << worst[0] / bf16_unit << ", lse " << worst[1] / bf16_unit << ", dq " << worst[2] / bf16_unit << ", dk "
              << worst[3] / bf16_unit << ", dv " << worst[4] / bf16_unit << "\n";
  }
}

bool flash_built() {
  return loom::conformance::setup().subject.empty() && registry().find("attention", "flash") != nullptr;
}

// A problem whose exact bf16 results are known: head_dim 1, scale 1, one key seen by three
// queries (bidirectional), with inputs on or next to ties of bf16's rounding. Then lse_i = q_i k
// rounded as the tile product takes it, out_i = v and dv = sum_i dout_i (P = 1), each with its
// operands rounded to nearest even; truncation, or no rounding, gives other values.
TEST(AttentionConformance, FlashBf16RoundsTileOperandsToNearestEven) {
  if (!flash_built()) GTEST_SKIP() << "a check of loom's own flash kernel";
  if (!cpu_has_bf16()) GTEST_SKIP() << "this CPU has no AVX512-BF16: flash computes float32 (checked below)";
  for (const KernelVariant& variant : kernel_variants()) {
    if (variant.name != "flash") continue;
    SCOPED_TRACE(variant.label);
    auto flash = make_kernel(variant.name, variant.node);
    std::mt19937 rng(9);
    Problem p = make_problem({1, 3, 1, 1, 1, 1, false, 0, 0.0f, false, false}, rng);
    const float tie_down = 1.0f + 0x1p-8f;                 // halfway between 1 and 1 + 2^-7: to 1
    const float tie_up = 1.0f + 3 * 0x1p-8f;               // halfway, odd below: to 1 + 2^-6
    const float above_tie = 1.0f + 0x1p-8f + 0x1p-20f;     // just above halfway: to 1 + 2^-7
    const float key = 2.0f + 3 * 0x1p-7f, value = tie_up;  // to 2 + 2^-5 and 1 + 2^-6
    const float queries[3] = {tie_down, tie_up, above_tie}, douts[3] = {above_tie, tie_down, tie_up};
    for (int64_t i = 0; i < 3; ++i) {
      p.q_buf[static_cast<std::size_t>(i * p.q_token_stride)] = queries[i];
      p.dout[static_cast<std::size_t>(i)] = douts[i];
    }
    p.kv_buf[static_cast<std::size_t>(p.k_offset)] = key;
    p.kv_buf[static_cast<std::size_t>(p.v_offset)] = value;
    p.args.params.scale = 1.0f;
    p.args.compute = loom::DType::bf16;
    const Results r = run(*flash, p);
    EXPECT_EQ(round_bf16(tie_down), 1.0f);
    EXPECT_EQ(round_bf16(tie_up), 1.0f + 0x1p-6f);
    EXPECT_EQ(round_bf16(above_tie), 1.0f + 0x1p-7f);
    EXPECT_EQ(round_bf16(key), 2.0f + 0x1p-5f);
    float dv = 0.0f;
    for (int64_t i = 0; i < 3; ++i) {
      const std::size_t at = static_cast<std::size_t>(i);
      EXPECT_EQ(r.lse[at], round_bf16(queries[i]) * round_bf16(key)) << "row " << i;
      EXPECT_NE(r.lse[at], queries[i] * key) << "row " << i << ": not rounded";
      EXPECT_EQ(r.out[at], round_bf16(value)) << "row " << i;
      dv += round_bf16(douts[i]);
    }
    EXPECT_EQ(r.dv[0], dv);
    EXPECT_NE(r.dv[0], douts[0] + douts[1] + douts[2]);
  }
}

// With AVX512-BF16, compute = bf16 changes every result of flash against its float32 run by more
// than float32 rounding could (at least u / 16 = 1.2e-4 of the scale, where flash and naive in
// float32 differ by about 1e-7), on causal, windowed, soft-capped, GQA and packed problems; the
// float32 run before the bf16 run and the one after it are bit-identical (no bf16 state leaks
// into the float32 path). Without AVX512-BF16, compute = bf16 gives the float32 bits.
TEST(AttentionConformance, FlashBf16ChangesResultsAndLeavesFloat32Alone) {
  if (!flash_built()) GTEST_SKIP() << "a check of loom's own flash kernel";
  const bool bf16 = cpu_has_bf16();
  const Case cases[] = {
      {2, 70, 70, 4, 2, 64, true, 0, 0.0f, false, true},   // causal GQA over several tiles, fused qkv
      {1, 45, 45, 2, 2, 16, true, 9, 0.0f, true, false},   // window and segments
      {1, 21, 33, 3, 1, 7, false, 0, 3.0f, false, false},  // MQA, soft-cap, a cache, odd head_dim
  };
  for (const KernelVariant& variant : kernel_variants()) {
    if (variant.name != "flash") continue;
    auto flash = make_kernel(variant.name, variant.node);
    std::mt19937 rng(10);
    for (const Case& c : cases) {
      SCOPED_TRACE(variant.label + ", " + c.str());
      Problem p = make_problem(c, rng);
      const Results before = run(*flash, p);
      p.args.compute = loom::DType::bf16;
      const Results rounded = run(*flash, p);
      p.args.compute = loom::DType::f32;
      const Results after = run(*flash, p);
      EXPECT_EQ(before.out, after.out);
      EXPECT_EQ(before.lse, after.lse);
      EXPECT_EQ(before.dq, after.dq);
      EXPECT_EQ(before.dk, after.dk);
      EXPECT_EQ(before.dv, after.dv);
      if (bf16) {
        EXPECT_GT(relative_error(rounded.out, before.out), bf16_unit / 16) << "out not rounded";
        EXPECT_GT(relative_error(rounded.lse, before.lse), bf16_unit / 16) << "lse not rounded";
        EXPECT_GT(relative_error(rounded.dq, before.dq), bf16_unit / 16) << "dq not rounded";
        EXPECT_GT(relative_error(rounded.dk, before.dk), bf16_unit / 16) << "dk not rounded";
        EXPECT_GT(relative_error(rounded.dv, before.dv), bf16_unit / 16) << "dv not rounded";
      } else {
        EXPECT_EQ(rounded.out, before.out);
        EXPECT_EQ(rounded.lse, before.lse);
        EXPECT_EQ(rounded.dq, before.dq);
        EXPECT_EQ(rounded.dk, before.dk);
        EXPECT_EQ(rounded.dv, before.dv);
      }
    }
  }
}

// flash's bf16 backward keeps the rounded query and output-gradient tiles of a (batch, kv head)
// for its later key tiles (within bf16_cache_mib) or rounds them at every use (past it): the
// same bits either way, across heads of a group, batches and (with dq partials) key stripes.
TEST(AttentionConformance, FlashBf16CacheOfRoundedTilesDoesNotChangeResults) {
  if (!flash_built()) GTEST_SKIP() << "a check of loom's own flash kernel";
  loom::Value uncached = loom::Value::map();
  uncached.set("type", loom::Value("flash"));
  uncached.set("bf16_cache_mib", loom::Value(std::int64_t{0}));
  auto cached_kernel = make_kernel("flash"), uncached_kernel = make_kernel("flash", uncached);
  std::mt19937 rng(11);
  for (const Case& c : {Case{3, 150, 150, 4, 2, 16, true, 0, 0.0f, true, false},
                        Case{1, 70, 140, 3, 1, 64, false, 30, 0.0f, false, false}}) {
    SCOPED_TRACE(c.str());
    Problem p = make_problem(c, rng);
    p.args.compute = loom::DType::bf16;
    const Results cached = run(*cached_kernel, p), again = run(*uncached_kernel, p);
    EXPECT_EQ(cached.out, again.out);
    EXPECT_EQ(cached.dq, again.dq);
    EXPECT_EQ(cached.dk, again.dk);
    EXPECT_EQ(cached.dv, again.dv);
  }
}

TEST(AttentionConformance, RowsWithNoVisibleKeyGiveZeroAndMinusInfinity) {
  if (const auto why = subject_unavailable()) GTEST_SKIP() << *why;
  for (const KernelVariant& variant : kernel_variants()) {
    SCOPED_TRACE(variant.label);
    auto kernel = make_kernel(variant.name, variant.node);
    std::mt19937 rng(6);
    Case c{1, 6, 6, 2, 1, 16, false, 0, 0.0f, true, false};
    Problem p = make_problem(c, rng);
    p.q_seg = {0, 0, 7, 1, 1, 7};  // rows 2 and 5 have an id no key has
    p.kv_seg = {0, 0, 0, 1, 1, 1};
    p.args.q_segments = p.q_seg.data();
    p.args.kv_segments = p.kv_seg.data();
    const Results r = run(*kernel, p);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i : {2, 5}) {
        EXPECT_EQ(r.lse[static_cast<size_t>(h * 6 + i)], negative_infinity);
        for (int64_t e = 0; e < 16; ++e) {
          EXPECT_EQ(r.out[static_cast<size_t>((i * 2 + h) * 16 + e)], 0.0f);
          EXPECT_EQ(r.dq[static_cast<size_t>((i * 2 + h) * 16 + e)], 0.0f);
        }
      }
  }
}

// Ops::attention on the reference backend: naive's gradients, as the tape delivers them to
// parameters (q, k and v as views of one fused qkv parameter), against central differences.
TEST(AttentionConformance, NaiveGradientsMatchFiniteDifferences) {
  if (registry().find("backend", "reference") == nullptr)
    GTEST_SKIP() << "the `reference` backend plugin is not built (plugins/backend/reference)";
  auto naive = make_kernel("naive");
  auto backend = registry().create<loom::Backend>(loom::ComponentRef{"backend", "reference", loom::Value(), "backend"});
  struct Small {
    int64_t q_len, kv_len, q_heads, kv_heads, head_dim;
    loom::AttentionParams params;
    bool segments;
  };
  const Small smalls[] = {
      {5, 5, 2, 1, 3, {true, 0, 0.0f, 0.0f}, false},
      {4, 4, 2, 2, 4, {false, 2, 1.5f, 0.0f}, true},
      {3, 6, 3, 1, 2, {true, 3, 0.0f, 0.7f}, false},
  };
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Small& s : smalls) {
    const int64_t heads = s.q_heads + 2 * s.kv_heads;
    // q comes from the last q_len tokens of a [1, kv_len, heads, head_dim] fused parameter.
    std::vector<float> init(static_cast<size_t>(s.kv_len * heads * s.head_dim));
    for (float& x : init) x = normal(rng);
    loom::Parameter qkv("qkv", Tensor::from(init, loom::Shape{1, s.kv_len, heads, s.head_dim}));
    std::vector<float> weights(static_cast<size_t>(s.q_len * s.q_heads * s.head_dim));
    for (float& x : weights) x = normal(rng);
    const Tensor seed = Tensor::from(weights, loom::Shape{1, s.q_len, s.q_heads, s.head_dim});
    Tensor q_seg, kv_seg;
    if (s.segments) {
      std::vector<std::int32_t> ks(static_cast<size_t>(s.kv_len));
      for (int64_t j = 0; j < s.kv_len; ++j) ks[static_cast<size_t>(j)] = j < s.kv_len / 2 ? 0 : 1;
      kv_seg = Tensor::from(ks, loom::Shape{1, s.kv_len});
      q_seg = Tensor::from(std::vector<std::int32_t>(ks.end() - s.q_len, ks.end()), loom::Shape{1, s.q_len});
    }
    auto loss = [&](loom::Ops& ops) {
      const Tensor& x = qkv.tensor();
      const Tensor q = x.slice(2, 0, s.q_heads).slice(1, s.kv_len - s.q_len, s.kv_len);
      const Tensor k = x.slice(2, s.q_heads, s.q_heads + s.kv_heads);
      const Tensor v = x.slice(2, s.q_heads + s.kv_heads, heads);
      return ops.attention(*naive, q, k, v, s.params, q_seg, kv_seg);
    };
    loom::Tape tape;
    loom::Ops ops(*backend, &tape);
    tape.backward(loss(ops), seed);
    ASSERT_TRUE(qkv.has_grad());
    const std::vector<float> analytic = qkv.grad().to_vector();

    loom::Ops plain(*backend);
    auto objective = [&] {
      const std::vector<float> out = loss(plain).to_vector();
      double sum = 0.0;
      for (size_t i = 0; i < out.size(); ++i) sum += double{out[i]} * weights[i];
      return sum;
    };
    const Tensor data = qkv.data();
    float* values = data.data<float>();
    constexpr float step = 1e-2f;
    double scale = 0.0, worst = 0.0;
    for (float g : analytic) scale = std::max(scale, std::fabs(double{g}));
    for (size_t i = 0; i < init.size(); ++i) {
      const float saved = values[i];
      values[i] = saved + step;
      const double up = objective();
      values[i] = saved - step;
      const double down = objective();
      values[i] = saved;
      const double numeric = (up - down) / (2.0 * step);
      worst = std::max(worst, std::fabs(numeric - analytic[i]));
    }
    EXPECT_LE(worst, 2e-3 * scale + 2e-4) << "largest difference " << worst << " for gradients of scale " << scale;
    std::cout << "[ gradient ] naive, " << s.q_len << " queries, " << s.kv_len << " keys: largest difference from "
              << "central differences " << worst << " (gradients up to " << scale << ")\n";
  }
}

}  // namespace
