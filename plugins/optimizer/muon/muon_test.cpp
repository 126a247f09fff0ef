// The muon optimizer on its own: which parameters it orthogonalises, the orthogonalisation of a
// gradient whose orthogonal factor is known, and its need for a backend. The PyTorch comparison
// (Jordan's muon.py transcribed) and the state round trip are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class MuonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN, LOOM_CPU_BACKEND_PLUGIN});
    backend_ = ot::create_cpu_backend(*registry_);
  }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "muon", options);
  }
  std::unique_ptr<loom::Registry> registry_;
  loom::Handle<loom::Backend> backend_;
};

// Matrices of role weight get a momentum buffer; embeddings, vectors and the weights adam_for
// names get AdamW's two moments.
TEST_F(MuonTest, OrthogonalisesHiddenMatricesOnly) {
  auto opt = create();
  std::vector<float> v(12, 0.5f);
  std::deque<loom::Parameter> ps;
  ps.emplace_back("h.0.mlp.c_fc.weight", loom::Tensor::from(std::span<const float>(v), {3, 4}));
  ps.emplace_back("wte.weight", loom::Tensor::from(std::span<const float>(v), {3, 4}));
  ps.emplace_back("lm_head.weight", loom::Tensor::from(std::span<const float>(v), {3, 4}));
  ps.emplace_back("h.0.mlp.c_fc.bias", loom::Tensor::from(std::span<const float>(v), {12}));
  loom::OptimizerSetup setup;
  setup.parameters = {{&ps[0], true, loom::ParameterRole::weight},
                      {&ps[1], false, loom::ParameterRole::embedding},
                      {&ps[2], true, loom::ParameterRole::weight},
                      {&ps[3], false, loom::ParameterRole::bias}};
  setup.backend = backend_.get();
  opt->init(setup);
  std::vector<std::string> names;
  for (const auto& [name, tensor] : opt->state()) names.push_back(name);
  EXPECT_EQ(names,
            (std::vector<std::string>{"momentum_buffer/h.0.mlp.c_fc.weight", "exp_avg/wte.weight",
                                      "exp_avg_sq/wte.weight", "exp_avg/lm_head.weight", "exp_avg_sq/lm_head.weight",
                                      "exp_avg/h.0.mlp.c_fc.bias", "exp_avg_sq/h.0.mlp.c_fc.bias"}));
}

// The orthogonal factor of diag(4, 1) is the identity: five quintic Newton-Schulz steps bring
// both singular values into the iteration's band around 1 (about [0.7, 1.2]) and keep the
// off-diagonal exactly 0, so the step moves the weight by about lr along the diagonal whatever
// the gradient's scale.
TEST_F(MuonTest, TheUpdateIsTheOrthogonalisedGradient) {
  auto opt = create({{"weight_decay", Value(0.0)}, {"nesterov", Value(false)}});
  ot::ParameterSet set;
  set.backend = backend_.get();
  set.add("w", {2, 2}, true, std::vector<float>{0, 0, 0, 0});
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], std::vector<float>{400.0f, 0.0f, 0.0f, 100.0f});
  opt->step(0.5, 0);
  const auto w = set.parameters[0].data().to_vector();
  EXPECT_EQ(w[1], 0.0f);
  EXPECT_EQ(w[2], 0.0f);
  for (float d : {w[0], w[3]}) {
    EXPECT_LT(d, -0.5f * 0.65f);
    EXPECT_GT(d, -0.5f * 1.25f);
  }
}

TEST_F(MuonTest, MatricesNeedTheRunsBackend) {
  auto opt = create();
  ot::ParameterSet set;
  set.add("w", {2, 2}, true, std::vector<float>{1, 2, 3, 4});
  loom::OptimizerSetup setup = set.for_optimizer();
  setup.backend = nullptr;
  opt->init(setup);
  ot::set_gradient(set.parameters[0], std::vector<float>{1, 0, 0, 1});
  EXPECT_THROW(opt->step(0.1, 0), loom::InternalError);
}

}  // namespace
