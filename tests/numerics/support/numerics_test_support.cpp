#include "numerics_test_support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <loom/core/plugin_host.hpp>
#include <loom/random.hpp>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

namespace loom::test {

namespace {
std::optional<std::vector<PluginSearchPath>>& plugin_search_override() {
  static std::optional<std::vector<PluginSearchPath>> search;
  return search;
}
}  // namespace

void use_plugins(std::vector<PluginSearchPath> search) {
  plugin_search_override() = std::move(search);
}

Registry& plugin_registry() {
  static Registry* registry = [] {
    auto* r = new Registry;
    PluginHost host;
    host.load(plugin_search_override().value_or(PluginHost::default_search_path(
                  {{LOOM_TEST_PLUGIN_DIR, "tests"}, {LOOM_TEST_DEVICE_PLUGIN_DIR, "tests (test devices)"}}, {})),
              *r);
    return r;
  }();
  return *registry;
}

std::vector<std::string> registered(std::string_view kind) {
  std::vector<std::string> names;
  for (const auto* e : plugin_registry().list(kind)) names.push_back(e->decl.name);
  std::sort(names.begin(), names.end());
  return names;
}

Handle<Backend> make_backend(const std::string& name, ExecutionContext* execution, const Value& options) {
  Registry& r = plugin_registry();
  Value node = options;
  node.set("type", name);
  r.set_execution_context(execution);
  Handle<Backend> b = r.create<Backend>(ComponentRef{"backend", name, node, "backend"});
  r.set_execution_context(nullptr);
  return b;
}

Handle<Backend> make_f32_backend(const std::string& name, ExecutionContext* execution, const Value& options) {
  Value node = options;
  const ComponentEntry* entry = plugin_registry().find("backend", name);
  if (entry && entry->decl.options.find("matmul_precision")) node.set("matmul_precision", "f32");
  Handle<Backend> b = make_backend(name, execution, node);
  if (b->matmul_dtype() != DType::f32)
    ADD_FAILURE() << "backend '" << name << "' computes its matrix products in " << dtype_name(b->matmul_dtype())
                  << " and declares no matmul_precision option to ask for f32";
  return b;
}

std::optional<std::string> device_unavailable(const std::string& name) {
  static std::map<std::string, std::optional<std::string>> known;
  if (auto it = known.find(name); it != known.end()) return it->second;
  std::optional<std::string> why;
  try {
    (void)make_backend(name);
  } catch (const DeviceUnavailable& e) {
    why = e.what();
  } catch (const Error&) {
    // Another refusal (an option this CPU lacks, ...) is the test's to report.
  }
  known.emplace(name, why);
  return why;
}

bool cpu_has_avx512_bf16() {
  // As the cpu backend decides (plugins/backend/cpu/gemm_bf16.cpp).
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
}

Handle<AttentionKernel> make_attention(const std::string& name, const Value& options) {
  Value node = options;
  node.set("type", name);
  return plugin_registry().create<AttentionKernel>(ComponentRef{"attention", name, node, "attention"});
}

Handle<AttentionKernel> attention_for(const Backend& backend) {
  const Device device = backend.device();
  if (device.is_host()) return std::make_shared<NaiveAttention>();
  for (const std::string& name : registered("attention")) {
    Handle<AttentionKernel> kernel;
    try {
      kernel = make_attention(name);
    } catch (const DeviceUnavailable&) {
      continue;  // a kernel of a device this machine lacks (cuda-flash without a GPU)
    }
    if (kernel->device() == device) return kernel;
  }
  return nullptr;
}

Tensor on_backend(const Tensor& t, const Backend& backend) {
  Tensor copy = Tensor::empty(t.shape(), t.dtype(), backend.buffer_type());
  copy.copy_from(t);
  return copy;
}

Tensor random_tensor(const Shape& shape, std::uint64_t key, float scale) {
  Tensor t = Tensor::empty(shape);
  float* p = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = scale * random_normal(key, static_cast<std::uint32_t>(i));
  return t;
}

Tensor random_ids(const Shape& shape, std::int32_t vocab, std::uint64_t key) {
  Tensor t = Tensor::empty(shape, DType::i32);
  auto* p = t.data<std::int32_t>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    p[i] =
        static_cast<std::int32_t>(random_bits(key, static_cast<std::uint32_t>(i)) % static_cast<std::uint32_t>(vocab));
  return t;
}

::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<float>& expected,
                                     double rtol) {
  if (actual.size() != expected.size())
    return ::testing::AssertionFailure() << "sizes differ: " << actual.size() << " vs " << expected.size();
  double scale = 0.0;
  for (float e : expected) scale = std::max(scale, std::fabs(static_cast<double>(e)));
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i], e = expected[i];
    if (std::isnan(a) != std::isnan(e))
      return ::testing::AssertionFailure() << "NaN mismatch at " << i << ": " << a << " vs " << e;
    const double ratio = std::fabs(a - e) / (std::fabs(e) + scale + 1e-30);
    if (ratio > worst) {
      worst = ratio;
      worst_i = i;
    }
  }
  if (worst <= rtol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << worst_i << " of " << actual.size() << ": " << actual[worst_i]
                                       << " vs expected " << expected[worst_i] << " (relative error " << worst << " > "
                                       << rtol << ", scale " << scale << ")";
}

::testing::AssertionResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes differ";
  if (!a.empty() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) != 0) {
    std::size_t i = 0;
    while (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) ++i;
    return ::testing::AssertionFailure() << "first difference at " << i << ": " << a[i] << " vs " << b[i];
  }
  return ::testing::AssertionSuccess();
}

// ---- NaiveAttention

namespace {

struct Problem {
  const AttentionForwardArgs& a;
  std::int64_t group() const { return a.q_heads / a.kv_heads; }
  const float* q(std::int64_t b, std::int64_t i, std::int64_t h) const {
    return a.q.data + b * a.q.batch_stride + i * a.q.token_stride + h * a.head_dim;
  }
  const float* k(std::int64_t b, std::int64_t j, std::int64_t g) const {
    return a.k.data + b * a.k.batch_stride + j * a.k.token_stride + g * a.head_dim;
  }
  const float* v(std::int64_t b, std::int64_t j, std::int64_t g) const {
    return a.v.data + b * a.v.batch_stride + j * a.v.token_stride + g * a.head_dim;
  }
  bool visible(std::int64_t b, std::int64_t i, std::int64_t j) const {
    const std::int64_t p = a.kv_len - a.q_len + i;
    if (a.params.causal && j > p) return false;
    if (a.params.window > 0) {
      if (p - j >= a.params.window) return false;
      if (!a.params.causal && j - p >= a.params.window) return false;
    }
    if (a.q_segments && a.q_segments[b * a.q_len + i] != a.kv_segments[b * a.kv_len + j]) return false;
    return true;
  }
  // The raw scaled score and the soft-capped one.
  std::pair<double, double> score(std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t j) const {
    const float* qp = q(b, i, h);
    const float* kp = k(b, j, h / group());
    double dot = 0.0;
    for (std::int64_t d = 0; d < a.head_dim; ++d) dot += static_cast<double>(qp[d]) * kp[d];
    const double raw = a.params.scale * dot;
    const double c = a.params.softcap;
    return {raw, c > 0.0 ? c * std::tanh(raw / c) : raw};
  }
};

void store_grad(const AttentionGradient& g, const std::vector<double>& values, std::int64_t batch, std::int64_t len,
                std::int64_t width) {
  if (!g.data) return;
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < len; ++t)
      for (std::int64_t e = 0; e < width; ++e) {
        float& out = g.data[b * g.batch_stride + t * g.token_stride + e];
        const double v = values[static_cast<std::size_t>((b * len + t) * width + e)];
        out = g.accumulate ? static_cast<float>(out + v) : static_cast<float>(v);
      }
}

}  // namespace

void NaiveAttention::forward(const AttentionForwardArgs& a) {
  const Problem pr{a};
  const std::int64_t D = a.head_dim;
  p_.resize(static_cast<std::size_t>(a.kv_len));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.q_heads; ++h)
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < a.kv_len; ++j) {
          p_[static_cast<std::size_t>(j)] = pr.visible(b, i, j) ? pr.score(b, i, h, j).second : -INFINITY;
          mx = std::max(mx, p_[static_cast<std::size_t>(j)]);
        }
        float* out = a.out + ((b * a.q_len + i) * a.q_heads + h) * D;
        float& lse = a.lse[(b * a.q_heads + h) * a.q_len + i];
        if (mx == -INFINITY) {
          std::fill_n(out, D, 0.0f);
          lse = -INFINITY;
          continue;
        }
        double sum = 0.0;
        for (std::int64_t j = 0; j < a.kv_len; ++j) sum += std::exp(p_[static_cast<std::size_t>(j)] - mx);
        const double z = mx + std::log(sum);
        lse = static_cast<float>(z);
        for (std::int64_t d = 0; d < D; ++d) {
          double acc = 0.0;
          for (std::int64_t j = 0; j < a.kv_len; ++j)
            if (p_[static_cast<std::size_t>(j)] != -INFINITY)
              acc += std::exp(p_[static_cast<std::size_t>(j)] - z) * pr.v(b, j, h / pr.group())[d];
          out[d] = static_cast<float>(acc);
        }
      }
}

void NaiveAttention::backward(const AttentionBackwardArgs& args) {
  const AttentionForwardArgs& a = *args.forward;
  const Problem pr{a};
  const std::int64_t D = a.head_dim, group = pr.group();
  dq_.assign(static_cast<std::size_t>(a.batch * a.q_len * a.q_heads * D), 0.0);
  dk_.assign(static_cast<std::size_t>(a.batch * a.kv_len * a.kv_heads * D), 0.0);
  dv_.assign(dk_.size(), 0.0);
  p_.resize(static_cast<std::size_t>(a.kv_len));
  dp_.resize(static_cast<std::size_t>(a.kv_len));
  for (std::int64_t b = 0; b < a.batch; ++b)
    for (std::int64_t h = 0; h < a.q_heads; ++h)
      for (std::int64_t i = 0; i < a.q_len; ++i) {
        // Recompute the probabilities in float64 (the lse stored by the forward is float32).
        double mx = -INFINITY;
        for (std::int64_t j = 0; j < a.kv_len; ++j) {
          p_[static_cast<std::size_t>(j)] = pr.visible(b, i, j) ? pr.score(b, i, h, j).second : -INFINITY;
          mx = std::max(mx, p_[static_cast<std::size_t>(j)]);
        }
        if (mx == -INFINITY) continue;
        double sum = 0.0;
        for (std::int64_t j = 0; j < a.kv_len; ++j) sum += std::exp(p_[static_cast<std::size_t>(j)] - mx);
        const double z = mx + std::log(sum);
        const float* dout = args.dout + ((b * a.q_len + i) * a.q_heads + h) * D;
        double delta = 0.0;
        for (std::int64_t j = 0; j < a.kv_len; ++j) {
          double& p = p_[static_cast<std::size_t>(j)];
          p = p == -INFINITY ? 0.0 : std::exp(p - z);
          const float* vj = pr.v(b, j, h / group);
          double dp = 0.0;
          for (std::int64_t d = 0; d < D; ++d) dp += static_cast<double>(dout[d]) * vj[d];
          dp_[static_cast<std::size_t>(j)] = dp;
          delta += p * dp;
        }
        const float* qi = pr.q(b, i, h);
        for (std::int64_t j = 0; j < a.kv_len; ++j) {
          const double p = p_[static_cast<std::size_t>(j)];
          if (p == 0.0) continue;
          double ds = p * (dp_[static_cast<std::size_t>(j)] - delta);
          if (a.params.softcap > 0.0f) {
            const double t = std::tanh(pr.score(b, i, h, j).first / a.params.softcap);
            ds *= 1.0 - t * t;
          }
          const double g = ds * a.params.scale;
          const float* kj = pr.k(b, j, h / group);
          const std::size_t qo = static_cast<std::size_t>(((b * a.q_len + i) * a.q_heads + h) * D);
          const std::size_t ko = static_cast<std::size_t>(((b * a.kv_len + j) * a.kv_heads + h / group) * D);
          for (std::int64_t d = 0; d < D; ++d) {
            dq_[qo + static_cast<std::size_t>(d)] += g * kj[d];
            dk_[ko + static_cast<std::size_t>(d)] += g * qi[d];
            dv_[ko + static_cast<std::size_t>(d)] += p * dout[d];
          }
        }
      }
  store_grad(args.dq, dq_, a.batch, a.q_len, a.q_heads * D);
  store_grad(args.dk, dk_, a.batch, a.kv_len, a.kv_heads * D);
  store_grad(args.dv, dv_, a.batch, a.kv_len, a.kv_heads * D);
}

}  // namespace loom::test
