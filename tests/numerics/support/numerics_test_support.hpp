// Helpers shared by the numerics tests and the conformance suite: the plugins of this build,
// deterministic random tensors, tolerant comparison, and a naive attention kernel.
//
// The registry holds the build's plugins and the test device `guarded`
// (tests/fixtures/plugins/guarded_backend.cpp): a backend whose memory the host cannot touch.
// Code that runs over every registered backend creates its tensors on the backend's device
// (Backend::device()) and reads results back with to_vector().
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <loom/autograd.hpp>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/attention.hpp>
#include <loom/kinds/backend.hpp>
#include <optional>
#include <string>
#include <vector>

namespace loom::test {

// The registry with every plugin of this build's plugin directory and of LOOM_PLUGIN_PATH,
// loaded on first use.
Registry& plugin_registry();
// Makes plugin_registry() load `search` instead (the conformance runner: the installed oracles
// and the plugin under test). Call before its first use.
void use_plugins(std::vector<PluginSearchPath> search);
// Names of the registered components of `kind`, sorted.
std::vector<std::string> registered(std::string_view kind);
// Creates backend `name` on `execution` (default: the process's), with `options` (a map of its
// options; defaults for the rest).
Handle<Backend> make_backend(const std::string& name, ExecutionContext* execution = nullptr,
                             const Value& options = Value::map());
// make_backend, computing its matrix products in float32: with `matmul_precision: f32` where
// the backend declares that option (the cpu backend's default, auto, is bf16 on a CPU with
// AVX512-BF16). What a test that compares against float32 references or the float64 oracle at
// float32 tolerances creates. A test failure when the backend still computes in bf16.
Handle<Backend> make_f32_backend(const std::string& name, ExecutionContext* execution = nullptr,
                                 const Value& options = Value::map());
// Why backend `name` cannot be created on this machine (the DeviceUnavailable message: a GPU
// backend without a GPU, driver or CUDA libraries), or nullopt when it can. Tried once per name.
// What the conformance suites turn into GTEST_SKIP: a device that is not here is not a failure.
std::optional<std::string> device_unavailable(const std::string& name);
// Whether this CPU has AVX512-BF16: what the cpu backend's matmul_precision: auto resolves by.
bool cpu_has_avx512_bf16();
// Creates attention kernel `name` with `options`.
Handle<AttentionKernel> make_attention(const std::string& name, const Value& options = Value::map());
// An attention kernel that computes where `backend` does: a NaiveAttention for the host, else
// the first registered attention kernel whose device() is the backend's (nullptr when none).
Handle<AttentionKernel> attention_for(const Backend& backend);
// A copy of `t` in `backend`'s memory (a fresh buffer even on the host).
Tensor on_backend(const Tensor& t, const Backend& backend);

// Normal(0, scale) values, a pure function of `key`.
Tensor random_tensor(const Shape& shape, std::uint64_t key, float scale = 1.0f);
// Ids uniform in [0, vocab), a pure function of `key`.
Tensor random_ids(const Shape& shape, std::int32_t vocab, std::uint64_t key);

// Passes when |actual[i] - expected[i]| <= rtol * (|expected[i]| + max_j |expected[j]|) for
// every i: relative to each element and to the scale of the whole result. Reports the worst
// element otherwise.
::testing::AssertionResult all_close(const std::vector<float>& actual, const std::vector<float>& expected, double rtol);

// Bit-for-bit equality.
::testing::AssertionResult bitwise_equal(const std::vector<float>& a, const std::vector<float>& b);

// Attention as its definition in kinds/attention.hpp, in float64 loops: the oracle for attention
// kernels, and the kernel the numerics tests use for the attention operation. Allocates only
// when a problem is larger than any before.
class NaiveAttention final : public AttentionKernel {
 public:
  void forward(const AttentionForwardArgs& args) override;
  void backward(const AttentionBackwardArgs& args) override;

 private:
  std::vector<double> p_, dp_, dq_, dk_, dv_;
};

}  // namespace loom::test
