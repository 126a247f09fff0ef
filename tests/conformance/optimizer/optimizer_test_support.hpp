// What the optimizer tests share: loading optimizer plugins through the real host, creating
// optimizers from option maps, parameters with gradients set to chosen values, and bitwise
// comparison of tensors.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <filesystem>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/backend.hpp>
#include <loom/kinds/optimizer.hpp>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace loom::optimizer_test {

// Gradients reach a Parameter only through the tape, and the tape computes through a backend.
// Giving a parameter the gradient g takes one operation, y = 1 * p, back-propagated with seed g;
// it runs Ops::scale's kernels and (for zero-filling) fill, which this backend implements.
// Optimizer tests need no other kernel, so every other one reports that it was not expected.
class GradientBackend final : public Backend {
 public:
  std::string_view name() const override { return "gradient"; }
  void scale(const float* x, float alpha, float* y, std::int64_t n, bool accumulate) override {
    for (std::int64_t i = 0; i < n; ++i) y[i] = accumulate ? y[i] + alpha * x[i] : alpha * x[i];
  }
  void fill(float* y, float value, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) y[i] = value;
  }
  void add(const float* a, const float* b, float* y, std::int64_t n) override {
    for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }

  void gemm(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
            const float*, std::int64_t, float, float*, std::int64_t) override {
    unexpected("gemm");
  }
  void gemm_batched(Transpose, Transpose, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                    std::int64_t, const float*, std::int64_t, std::int64_t, float, float*, std::int64_t, std::int64_t,
                    std::int64_t) override {
    unexpected("gemm_batched");
  }
  void bias_activation_forward(float*, const float*, float*, std::int64_t, std::int64_t, Activation) override {
    unexpected("bias_activation_forward");
  }
  void bias_activation_backward(const float*, const float*, float*, float*, bool, std::int64_t, std::int64_t,
                                Activation) override {
    unexpected("bias_activation_backward");
  }
  void activation_forward(Activation, const float*, float*, std::int64_t) override { unexpected("activation_forward"); }
  void activation_backward(Activation, const float*, const float*, float*, std::int64_t, bool) override {
    unexpected("activation_backward");
  }
  void swiglu_forward(const float*, const float*, float*, std::int64_t) override { unexpected("swiglu_forward"); }
  void swiglu_backward(const float*, const float*, const float*, float*, bool, float*, bool, std::int64_t) override {
    unexpected("swiglu_backward");
  }
  void dropout(const float*, float*, std::int64_t, float, std::uint64_t, bool) override { unexpected("dropout"); }
  void layer_norm_forward(const float*, const float*, const float*, float*, float*, float*, std::int64_t, std::int64_t,
                          float) override {
    unexpected("layer_norm_forward");
  }
  void layer_norm_backward(const float*, const float*, const float*, const float*, const float*, float*, bool, float*,
                           bool, float*, bool, std::int64_t, std::int64_t) override {
    unexpected("layer_norm_backward");
  }
  void add_layer_norm_forward(const float*, const float*, float*, const float*, const float*, float*, float*, float*,
                              std::int64_t, std::int64_t, float) override {
    unexpected("add_layer_norm_forward");
  }
  void rms_norm_forward(const float*, const float*, float*, float*, std::int64_t, std::int64_t, float) override {
    unexpected("rms_norm_forward");
  }
  void rms_norm_backward(const float*, const float*, const float*, const float*, float*, bool, float*, bool,
                         std::int64_t, std::int64_t) override {
    unexpected("rms_norm_backward");
  }
  void add_rms_norm_forward(const float*, const float*, float*, const float*, float*, float*, std::int64_t,
                            std::int64_t, float) override {
    unexpected("add_rms_norm_forward");
  }
  void embedding_forward(const float*, const std::int32_t*, float*, std::int64_t, std::int64_t, std::int64_t) override {
    unexpected("embedding_forward");
  }
  void embedding_backward(const std::int32_t*, const float*, float*, std::int64_t, std::int64_t,
                          std::int64_t) override {
    unexpected("embedding_backward");
  }
  void rope(const float*, std::int64_t, std::int64_t, float*, std::int64_t, std::int64_t, const float*, const float*,
            const std::int32_t*, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, bool, bool,
            bool) override {
    unexpected("rope");
  }
  void cross_entropy_forward(const float*, std::int64_t, const std::int32_t*, float*, float*, std::int64_t,
                             std::int64_t, std::int32_t) override {
    unexpected("cross_entropy_forward");
  }
  void cross_entropy_backward(float*, std::int64_t, const std::int32_t*, const float*, float, std::int64_t,
                              std::int64_t, std::int32_t) override {
    unexpected("cross_entropy_backward");
  }
  void mul(const float*, const float*, float*, std::int64_t, bool) override { unexpected("mul"); }
  void softcap_forward(const float*, float*, float*, std::int64_t, float) override { unexpected("softcap_forward"); }
  void softcap_backward(const float*, float, const float*, float*, std::int64_t, bool) override {
    unexpected("softcap_backward");
  }
  void softmax_forward(const float*, float*, std::int64_t, std::int64_t) override { unexpected("softmax_forward"); }
  void softmax_backward(const float*, const float*, float*, std::int64_t, std::int64_t, bool) override {
    unexpected("softmax_backward");
  }
  void logsumexp_forward(const float*, float*, std::int64_t, std::int64_t) override { unexpected("logsumexp_forward"); }
  void logsumexp_backward(const float*, const float*, const float*, float*, std::int64_t, std::int64_t, bool) override {
    unexpected("logsumexp_backward");
  }
  void sum_forward(const float*, float*, std::int64_t) override { unexpected("sum_forward"); }
  void sum_backward(const float*, float*, std::int64_t, bool) override { unexpected("sum_backward"); }
  void loss_reduce(const float*, const float*, const std::int32_t*, std::int64_t, std::int32_t, float, float,
                   float*) override {
    unexpected("loss_reduce");
  }
  void z_loss_forward(float*, const float*, const std::int32_t*, std::int64_t, std::int32_t, float) override {
    unexpected("z_loss_forward");
  }
  void z_loss_backward(float*, std::int64_t, const std::int32_t*, const float*, float, float, std::int64_t,
                       std::int64_t, std::int32_t) override {
    unexpected("z_loss_backward");
  }

 private:
  [[noreturn]] static void unexpected(const char* kernel) {
    throw InternalError(std::string("optimizer tests: the gradient backend has no '") + kernel +
                        "' kernel (only scale, fill and add)");
  }
};

// Makes `values` the gradient of `p`, exactly (1 * g == g in float arithmetic).
inline void set_gradient(Parameter& p, std::span<const float> values) {
  static GradientBackend backend;
  p.zero_grad();
  Tape tape;
  Ops ops(backend, &tape);
  const Tensor y = ops.scale(p.tensor(), 1.0f);
  tape.backward(y, Tensor::from(values, p.shape()));
}

// A registry holding the given plugin files (or directories).
inline std::unique_ptr<Registry> load_plugins(const std::vector<std::filesystem::path>& files) {
  auto registry = std::make_unique<Registry>();
  std::vector<PluginSearchPath> paths;
  for (const auto& f : files) paths.push_back({f, "test"});
  PluginHost().load(paths, *registry);
  return registry;
}

// The cpu backend from `registry` (which must have loaded its plugin), for optimizers that compute
// through a backend's GEMM (muon, soap). In float32 (matmul_precision: f32; its default computes
// the products in bf16 where the CPU has AVX512-BF16): the optimizers' updates are checked against
// PyTorch's float32 ones, step by step.
inline Handle<Backend> create_cpu_backend(const Registry& registry) {
  Value node = Value::map();
  node.set("type", Value("cpu"));
  node.set("matmul_precision", Value("f32"));
  return registry.create<Backend>(ComponentRef{"backend", "cpu", node, "backend"});
}

// Creates optimizer `name` from {type: name, options...}.
inline Handle<Optimizer> create_optimizer(const Registry& registry, const std::string& name,
                                          const Value::Map& options = {}) {
  Value node = Value::map();
  node.set("type", Value(name));
  for (const auto& [key, value] : options) node.set(key, value);
  return registry.create<Optimizer>(ComponentRef{"optimizer", name, node, "optimizer"});
}

// A set of parameters of odd shapes, some without weight decay, with seeded random values.
struct ParameterSet {
  std::deque<Parameter> parameters;  // stable addresses
  std::vector<bool> weight_decay;

  void add(std::string name, Shape shape, bool decay, std::span<const float> values) {
    parameters.emplace_back(std::move(name), Tensor::from(values, shape));
    weight_decay.push_back(decay);
  }
  // What init() gets: these parameters (role weight) and `backend`, when a test sets one.
  OptimizerSetup for_optimizer() {
    OptimizerSetup setup;
    for (std::size_t i = 0; i < parameters.size(); ++i)
      setup.parameters.push_back({&parameters[i], weight_decay[i], ParameterRole::weight});
    setup.backend = backend ? backend : default_backend;
    return setup;
  }
  Backend* backend = nullptr;
  // The backend of every set that names none (a suite sets it to the cpu backend once).
  static inline Backend* default_backend = nullptr;
};

inline std::vector<float> random_values(std::mt19937& rng, std::int64_t n, float scale) {
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype()) return false;
  const Tensor ca = a.clone(), cb = b.clone();
  return std::memcmp(ca.raw_data(), cb.raw_data(), static_cast<std::size_t>(ca.numel()) * dtype_size(ca.dtype())) == 0;
}

// An independent copy of an optimizer's state, as a checkpoint would hold it.
inline std::vector<std::pair<std::string, Tensor>> snapshot(const Optimizer& optimizer) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, tensor] : optimizer.state()) out.emplace_back(name, tensor.clone());
  return out;
}

}  // namespace loom::optimizer_test
