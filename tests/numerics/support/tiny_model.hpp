// A two-layer transformer that uses every operation of loom::Ops once or more: the workload of
// the determinism and allocation tests.
#pragma once

#include <deque>
#include <loom/autograd.hpp>
#include <memory>

#include "numerics_test_support.hpp"

namespace loom::test {

struct TinyModelConfig {
  std::int64_t batch = 2, seq = 24, dim = 48, heads = 4, kv_heads = 2, layers = 2, vocab = 101, ffn = 80;
  float dropout = 0.1f;
};

class TinyModel {
 public:
  // Parameters, positions and batches on `device` (the backend's that will run it).
  explicit TinyModel(const TinyModelConfig& config, std::uint64_t seed = 1, const Device& device = Device::host());

  // The loss of one batch (recorded when ops has a recording tape).
  Tensor loss(Ops& ops, AttentionKernel& attention, const Tensor& tokens, const Tensor& targets);
  // A deterministic batch: tokens and next-token targets (a few ignored).
  std::pair<Tensor, Tensor> batch(std::uint64_t step) const;

  std::deque<Parameter>& parameters() { return params_; }
  const TinyModelConfig& config() const { return config_; }

 private:
  Parameter& add(const std::string& name, const Shape& shape, float scale, std::uint64_t key);
  TinyModelConfig config_;
  Device device_;
  std::deque<Parameter> params_;
  RopeTable rope_;
  Tensor positions_;
};

}  // namespace loom::test
