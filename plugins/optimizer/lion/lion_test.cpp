// The lion optimizer on its own: defaults, option ranges, and the update worked out by hand.
// The PyTorch comparison and the state round trip are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class LionTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN}); }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "lion", options);
  }
  std::unique_ptr<loom::Registry> registry_;
};

TEST_F(LionTest, DefaultsFollowThePaper) {
  EXPECT_NE(create(), nullptr);
  // AdamW's 6e-4 and 0.1, scaled by the paper's factor of 10 in opposite directions.
  // Its own default peak rate, for the run layer's optimizer.learning_rate.
  const auto& suggested = registry_->find("optimizer", "lion")->decl.options.section_defaults();
  ASSERT_EQ(suggested.size(), 1u);
  EXPECT_EQ(suggested[0].first, "learning_rate");
  EXPECT_EQ(suggested[0].second.as_double(), 6e-5);
  const loom::OptionSchema& schema = registry_->find("optimizer", "lion")->decl.options;
  EXPECT_EQ(schema.find("beta1")->default_value().as_double(), 0.9);
  EXPECT_EQ(schema.find("beta2")->default_value().as_double(), 0.99);
  EXPECT_EQ(schema.find("weight_decay")->default_value().as_double(), 1.0);
}

TEST_F(LionTest, RejectsOptionsOutOfRangeNamingTheOption) {
  const std::vector<std::pair<std::string, double>> bad{
      {"beta1", 1.0}, {"beta2", 1.5}, {"beta2", -0.1}, {"weight_decay", -1.0}};
  for (const auto& [option, value] : bad) {
    try {
      create({{option, Value(value)}});
      ADD_FAILURE() << option << " = " << value << " was accepted";
    } catch (const loom::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  }
}

// The update is a sign: every coordinate with a nonzero c moves by exactly lr, whatever the
// gradient's magnitude, and a coordinate with c = 0 does not move.
TEST_F(LionTest, EveryCoordinateMovesByLrTimesTheSignOfTheInterpolation) {
  const float lr = 0.125f;
  auto opt = create({{"weight_decay", Value(0.0)}});
  const std::vector<float> w0{1.0f, 1.0f, 1.0f, 1.0f}, g{1e-6f, -300.0f, 0.0f, 2.0f};
  ot::ParameterSet set;
  set.add("w", {4}, true, w0);
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], g);
  opt->step(lr, 0);
  EXPECT_EQ(set.parameters[0].data().to_vector(), (std::vector<float>{0.875f, 1.125f, 1.0f, 0.875f}));

  // m = (1 - beta2) g after the first step; c = beta1 m + (1 - beta1) g picks the sign of the
  // momentum over a smaller opposite gradient.
  const auto m = opt->state()[0].second.to_vector();
  EXPECT_EQ(opt->state()[0].first, "exp_avg/w");
  for (std::size_t i = 0; i < g.size(); ++i) EXPECT_FLOAT_EQ(m[i], 0.01f * g[i]);
  ot::set_gradient(set.parameters[0], std::vector<float>{0.0f, 0.0f, 0.0f, -1e-3f});
  opt->step(lr, 1);  // c[3] = 0.9 * 0.02 - 0.1 * 1e-3 > 0
  EXPECT_EQ(set.parameters[0].data().to_vector(), (std::vector<float>{0.75f, 1.25f, 1.0f, 0.75f}));
}

// Decoupled decay: with no gradient signal (c = 0), p <- p - lr * wd * p, only where masked.
TEST_F(LionTest, DecaysOnlyMaskedParameters) {
  const double lr = 0.01, wd = 2.0;
  auto opt = create({{"weight_decay", Value(wd)}});
  ot::ParameterSet set;
  set.add("w", {2}, true, std::vector<float>{1.0f, -3.0f});
  set.add("ln.weight", {2}, false, std::vector<float>{1.0f, -3.0f});
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], std::vector<float>{0.0f, 0.0f});
  ot::set_gradient(set.parameters[1], std::vector<float>{0.0f, 0.0f});
  opt->step(lr, 0);
  const auto w = set.parameters[0].data().to_vector();
  EXPECT_FLOAT_EQ(w[0], static_cast<float>(1.0 - lr * wd * 1.0));
  EXPECT_FLOAT_EQ(w[1], static_cast<float>(-3.0 + lr * wd * 3.0));
  EXPECT_EQ(set.parameters[1].data().to_vector(), (std::vector<float>{1.0f, -3.0f}));
}

}  // namespace
