// The adamw optimizer on its own: its defaults, its option ranges, and the update worked out by
// hand. The PyTorch comparison and the state round trip are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class AdamWTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN}); }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "adamw", options);
  }
  std::unique_ptr<loom::Registry> registry_;
};

TEST_F(AdamWTest, DefaultsAreLevantersAdamConfig) {
  EXPECT_NE(create(), nullptr);
  // The optimizer section's default peak rate (6e-4) is AdamConfig's: no default of its own.
  EXPECT_TRUE(registry_->find("optimizer", "adamw")->decl.options.section_defaults().empty());
  const loom::OptionSchema& schema = registry_->find("optimizer", "adamw")->decl.options;
  EXPECT_EQ(schema.find("beta1")->default_value().as_double(), 0.9);
  EXPECT_EQ(schema.find("beta2")->default_value().as_double(), 0.95);
  EXPECT_EQ(schema.find("epsilon")->default_value().as_double(), 1e-8);
  EXPECT_EQ(schema.find("weight_decay")->default_value().as_double(), 0.1);
}

TEST_F(AdamWTest, RejectsOptionsOutOfRangeNamingTheOption) {
  const std::vector<std::pair<std::string, double>> bad{
      {"beta1", 1.0}, {"beta1", -0.1}, {"beta2", 1.0}, {"epsilon", 0.0}, {"weight_decay", -0.01}};
  for (const auto& [option, value] : bad) {
    try {
      create({{option, Value(value)}});
      ADD_FAILURE() << option << " = " << value << " was accepted";
    } catch (const loom::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(create({{"beta1", Value(0.0)}, {"beta2", Value(0.0)}, {"weight_decay", Value(0.0)}}));
}

// After the first step m = (1 - b1) g and v = (1 - b2) g^2, so the bias-corrected update is
// g / (|g| + eps): about lr in size whatever the gradient's scale. Decay applies only where the
// weight-decay mask says so.
TEST_F(AdamWTest, FirstStepMovesEachCoordinateByAboutLrAndDecaysOnlyMaskedParameters) {
  const double lr = 1e-2, wd = 0.5, eps = 1e-8;
  auto opt = create({{"weight_decay", Value(wd)}});
  const std::vector<float> w0{0.5f, -1.0f, 2.0f, 0.0f}, g{1e-3f, -50.0f, 3.0f, 0.25f};
  ot::ParameterSet set;
  set.add("w", {4}, true, w0);
  set.add("b", {4}, false, w0);
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], g);
  ot::set_gradient(set.parameters[1], g);
  opt->step(lr, 0);
  const auto w1 = set.parameters[0].data().to_vector(), b1 = set.parameters[1].data().to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    const double adam = g[i] / (std::fabs(g[i]) + eps);
    EXPECT_NEAR(w1[i], w0[i] * (1 - lr * wd) - lr * adam, 1e-6) << i;
    EXPECT_NEAR(b1[i], w0[i] - lr * adam, 1e-6) << i;
  }
  // The moments, by their PyTorch names.
  const auto state = opt->state();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].first, "exp_avg/w");
  EXPECT_EQ(state[1].first, "exp_avg_sq/w");
  EXPECT_EQ(state[2].first, "exp_avg/b");
  EXPECT_EQ(state[3].first, "exp_avg_sq/b");
  const auto m = state[0].second.to_vector(), v = state[1].second.to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_FLOAT_EQ(m[i], 0.1f * g[i]);
    EXPECT_FLOAT_EQ(v[i], 0.05f * g[i] * g[i]);
  }
}

// The bias corrections use the step the trainer passes: a constant gradient keeps the corrected
// moments at g and g^2 at every step, so every step moves by lr * g / (|g| + eps).
TEST_F(AdamWTest, BiasCorrectionFollowsTheStepCount) {
  const double lr = 1e-3;
  auto opt = create({{"weight_decay", Value(0.0)}});
  ot::ParameterSet set;
  set.add("w", {2}, true, std::vector<float>{1.0f, 1.0f});
  opt->init(set.for_optimizer());
  for (int t = 0; t < 50; ++t) {
    ot::set_gradient(set.parameters[0], std::vector<float>{2.0f, -0.5f});
    opt->step(lr, t);
  }
  const auto w = set.parameters[0].data().to_vector();
  EXPECT_NEAR(w[0], 1.0 - 50 * lr, 1e-5);
  EXPECT_NEAR(w[1], 1.0 + 50 * lr, 1e-5);
}

}  // namespace
