// Helpers the agreement tests share (loom against PyTorch, transformers and PEFT): the relative
// error they compare with, the float32 backend options their references need, and the reference
// outputs a Python script writes once per test suite.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/attention.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/tensor.hpp"
#include "loom/value.hpp"
#include "reference_required.hpp"

namespace loom::test {

// max |got - expected| / max |expected| (infinite when the sizes differ).
inline double relative_error(const std::vector<float>& got, const std::vector<float>& expected) {
  if (got.size() != expected.size()) return INFINITY;
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(got[i]) - expected[i]));
    scale = std::max(scale, std::abs(static_cast<double>(expected[i])));
  }
  return diff / std::max(scale, 1e-30);
}
inline double relative_error(const std::vector<float>& got, const Tensor& expected) {
  return relative_error(got, expected.to_vector());
}
inline double relative_error(const Tensor& got, const Tensor& expected) {
  return relative_error(got.to_vector(), expected.to_vector());
}

// A backend's options for float32 products: `matmul_precision: f32` where it declares that option
// (the cpu backend's default computes them in bf16 where the CPU has AVX512-BF16). The references
// are float32 ones, compared at float32 tolerances.
inline Value float32_options(const ComponentEntry& backend) {
  Value node = Value::map();
  node.set("type", Value(backend.decl.name));
  if (backend.decl.options.find("matmul_precision")) node.set("matmul_precision", Value("f32"));
  return node;
}

// The backend of `entry` with float32_options, when it computes in host memory here: these
// tests build their models in host memory. Null for a backend whose device this machine lacks
// (DeviceUnavailable: the cuda backend without a GPU) or whose memory is a device's.
inline Handle<Backend> host_float32_backend(Registry& registry, const ComponentEntry& entry) {
  Handle<Backend> backend;
  try {
    backend = registry.create<Backend>(ComponentRef{"backend", entry.decl.name, float32_options(entry), "backend"});
  } catch (const DeviceUnavailable&) {
    return {};
  }
  if (!backend->buffer_type().host_visible()) return {};
  return backend;
}

// Whether attention kernel `entry` computes in host memory here, as these tests' models do: false
// for a device's kernel (attention/cuda-flash: on cuda:N) and for one whose device this machine
// lacks (its creation throws DeviceUnavailable).
inline bool host_attention_kernel(Registry& registry, const ComponentEntry& entry) {
  try {
    return registry
        .create<AttentionKernel>(ComponentRef{"attention", entry.decl.name, Value(entry.decl.name), "attention"})
        ->device()
        .is_host();
  } catch (const DeviceUnavailable&) {
    return false;
  }
}

// The outputs a reference script writes with Debian's /usr/bin/python3 and torch into a fresh
// temporary directory: generate() once per test suite (SetUpTestSuite), remove() after it.
class TorchReference {
 public:
  // Runs `/usr/bin/python3 SCRIPT DIR`; where that python cannot import torch, runs nothing and
  // skip_reason() says why (the test suite then skips, so as to `purpose`).
  void generate(const std::string& script, const std::string& name, const std::string& purpose) {
    if (std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") != 0) {
      skip_reason_ =
          "/usr/bin/python3 cannot import torch: install Debian's python3-torch (scripts/install-deps.sh) to " +
          purpose;
      return;
    }
    dir_ = std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    generated_ = std::system(("/usr/bin/python3 '" + script + "' '" + dir_.string() + "'").c_str()) == 0;
  }
  void remove() {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  const std::filesystem::path& dir() const { return dir_; }
  const std::string& skip_reason() const { return skip_reason_; }
  bool generated() const { return generated_; }

 private:
  std::filesystem::path dir_;
  std::string skip_reason_;
  bool generated_ = false;
};

}  // namespace loom::test
