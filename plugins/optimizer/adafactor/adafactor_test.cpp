// The adafactor optimizer on its own: the factored state (rows + cols numbers per matrix, which is
// where its memory saving comes from), the optional first moment, and update clipping. The
// PyTorch comparison (Hugging Face's Adafactor transcribed) and the state round trip are in
// tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class AdafactorTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN}); }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "adafactor", options);
  }
  std::unique_ptr<loom::Registry> registry_;
};

std::vector<std::pair<std::string, std::vector<std::int64_t>>> state_shapes(const loom::Optimizer& opt) {
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> out;
  for (const auto& [name, tensor] : opt.state()) {
    std::vector<std::int64_t> dims;
    for (int d = 0; d < tensor.rank(); ++d) dims.push_back(tensor.shape()[d]);
    out.emplace_back(name, dims);
  }
  return out;
}

TEST_F(AdafactorTest, FactorsTheSecondMomentOfMatricesAndKeepsNoFirstMomentByDefault) {
  ot::ParameterSet set;
  set.add("w", {6, 4}, true, std::vector<float>(24, 0.5f));
  set.add("conv", {2, 3, 5}, true, std::vector<float>(30, 0.5f));
  set.add("b", {4}, false, std::vector<float>(4, 0.5f));
  auto opt = create();
  opt->init(set.for_optimizer());
  using Shapes = std::vector<std::pair<std::string, std::vector<std::int64_t>>>;
  EXPECT_EQ(state_shapes(*opt), (Shapes{{"exp_avg_sq_row/w", {6}},
                                        {"exp_avg_sq_col/w", {4}},
                                        {"exp_avg_sq_row/conv", {2, 3}},
                                        {"exp_avg_sq_col/conv", {2, 5}},
                                        {"exp_avg_sq/b", {4}}}));
  auto with_momentum = create({{"beta1", Value(0.9)}});
  ot::ParameterSet other;
  other.add("w", {6, 4}, true, std::vector<float>(24, 0.5f));
  with_momentum->init(other.for_optimizer());
  EXPECT_EQ(state_shapes(*with_momentum),
            (Shapes{{"exp_avg/w", {6, 4}}, {"exp_avg_sq_row/w", {6}}, {"exp_avg_sq_col/w", {4}}}));
}

// First step on a vector, unscaled: v = (1 - beta2t) g^2 + ... with beta2t = 1 - 1^-0.8 = 0, so
// v = g^2 + eps1 and u = g / |g| = sign(g), of RMS 1: clipping at 0.5 halves it.
TEST_F(AdafactorTest, TheFirstStepIsTheClippedSignOfTheGradient) {
  auto opt = create({{"scale_parameter", Value(false)}, {"clip_threshold", Value(0.5)}});
  ot::ParameterSet set;
  set.add("b", {4}, false, std::vector<float>{0, 0, 0, 0});
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], std::vector<float>{2.0f, -0.5f, 8.0f, -1.0f});
  opt->step(0.25, 0);
  EXPECT_EQ(set.parameters[0].data().to_vector(), (std::vector<float>{-0.125f, 0.125f, -0.125f, 0.125f}));
}

}  // namespace
