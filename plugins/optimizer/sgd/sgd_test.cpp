// The sgd optimizer on its own: defaults, option checks, and updates worked out by hand. The
// PyTorch comparison and the state round trip are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class SgdTest : public ::testing::Test {
 protected:
  void SetUp() override { registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN}); }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "sgd", options);
  }
  std::unique_ptr<loom::Registry> registry_;
};

TEST_F(SgdTest, DefaultsArePlainSgd) {
  EXPECT_NE(create(), nullptr);
  // Its own default peak rate, for the run layer's optimizer.learning_rate.
  const auto& suggested = registry_->find("optimizer", "sgd")->decl.options.section_defaults();
  ASSERT_EQ(suggested.size(), 1u);
  EXPECT_EQ(suggested[0].first, "learning_rate");
  EXPECT_EQ(suggested[0].second.as_double(), 1e-3);
  const loom::OptionSchema& schema = registry_->find("optimizer", "sgd")->decl.options;
  EXPECT_EQ(schema.find("momentum")->default_value().as_double(), 0.0);
  EXPECT_EQ(schema.find("dampening")->default_value().as_double(), 0.0);
  EXPECT_FALSE(schema.find("nesterov")->default_value().as_bool());
  EXPECT_EQ(schema.find("weight_decay")->default_value().as_double(), 0.0);
}

TEST_F(SgdTest, NesterovNeedsMomentumAndNoDampening) {
  for (const Value::Map& options :
       {Value::Map{{"nesterov", Value(true)}},
        Value::Map{{"nesterov", Value(true)}, {"momentum", Value(0.9)}, {"dampening", Value(0.1)}}}) {
    try {
      create(options);
      ADD_FAILURE() << "accepted";
    } catch (const loom::UserError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("optimizer.nesterov"), std::string::npos) << what;
      EXPECT_NE(what.find("momentum"), std::string::npos) << what;
      EXPECT_NE(what.find("dampening"), std::string::npos) << what;
    }
  }
  EXPECT_NO_THROW(create({{"nesterov", Value(true)}, {"momentum", Value(0.9)}}));
}

TEST_F(SgdTest, RejectsOptionsOutOfRangeNamingTheOption) {
  const std::vector<std::pair<std::string, double>> bad{
      {"momentum", 1.0}, {"momentum", -0.5}, {"dampening", 1.5}, {"weight_decay", -1e-4}};
  for (const auto& [option, value] : bad) {
    try {
      create({{option, Value(value)}});
      ADD_FAILURE() << option << " = " << value << " was accepted";
    } catch (const loom::UserError& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
  }
}

// p <- p - lr (g + wd p), with the L2 term only on masked parameters; no state without momentum.
TEST_F(SgdTest, PlainStepAddsL2ToTheGradientOnlyWhereMasked) {
  const float lr = 0.5f, wd = 0.25f;
  auto opt = create({{"weight_decay", Value(0.25)}});
  const std::vector<float> w0{1.0f, -2.0f, 4.0f}, g{0.5f, 0.25f, -1.0f};
  ot::ParameterSet set;
  set.add("w", {3}, true, w0);
  set.add("b", {3}, false, w0);
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], g);
  ot::set_gradient(set.parameters[1], g);
  opt->step(lr, 0);
  const auto w1 = set.parameters[0].data().to_vector(), b1 = set.parameters[1].data().to_vector();
  for (std::size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(w1[i], w0[i] - lr * (g[i] + wd * w0[i])) << i;  // exact: these values are dyadic
    EXPECT_EQ(b1[i], w0[i] - lr * g[i]) << i;
  }
  EXPECT_TRUE(opt->state().empty());
}

// PyTorch starts the momentum buffer at a parameter's first gradient, undamped; later steps
// damp. A parameter without a gradient yet has no buffer in the state.
TEST_F(SgdTest, MomentumBufferStartsAtTheFirstGradientThenDamps) {
  const float lr = 0.5f, mu = 0.5f, damp = 0.25f;
  auto opt = create({{"momentum", Value(0.5)}, {"dampening", Value(0.25)}});
  ot::ParameterSet set;
  set.add("w", {2}, true, std::vector<float>{1.0f, 1.0f});
  set.add("late", {2}, true, std::vector<float>{1.0f, 1.0f});
  opt->init(set.for_optimizer());
  EXPECT_TRUE(opt->state().empty());

  const std::vector<float> g1{1.0f, -2.0f}, g2{0.5f, 4.0f};
  ot::set_gradient(set.parameters[0], g1);
  opt->step(lr, 0);
  auto state = opt->state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].first, "momentum_buffer/w");
  EXPECT_EQ(state[0].second.to_vector(), g1);

  ot::set_gradient(set.parameters[0], g2);
  ot::set_gradient(set.parameters[1], g2);
  opt->step(lr, 1);
  state = opt->state();
  ASSERT_EQ(state.size(), 2u);
  const auto buf = state[0].second.to_vector();
  const auto w = set.parameters[0].data().to_vector();
  for (std::size_t i = 0; i < 2; ++i) {
    const float b = mu * g1[i] + (1 - damp) * g2[i];
    EXPECT_EQ(buf[i], b);
    EXPECT_EQ(w[i], (1.0f - lr * g1[i]) - lr * b);
  }
  EXPECT_EQ(state[1].first, "momentum_buffer/late");
  EXPECT_EQ(state[1].second.to_vector(), g2);  // its first gradient, undamped
}

// Nesterov: the step is d + momentum * buf instead of buf.
TEST_F(SgdTest, NesterovLooksAhead) {
  const float lr = 0.5f, mu = 0.5f;
  auto opt = create({{"momentum", Value(0.5)}, {"nesterov", Value(true)}});
  ot::ParameterSet set;
  set.add("w", {1}, true, std::vector<float>{2.0f});
  opt->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], std::vector<float>{1.0f});
  opt->step(lr, 0);  // buf = 1, step = 1 + 0.5 * 1
  EXPECT_EQ(set.parameters[0].data().item(), 2.0f - lr * (1.0f + mu * 1.0f));
  ot::set_gradient(set.parameters[0], std::vector<float>{2.0f});
  opt->step(lr, 1);  // buf = 0.5 + 2 = 2.5, step = 2 + 0.5 * 2.5
  EXPECT_EQ(set.parameters[0].data().item(), 1.25f - lr * (2.0f + mu * 2.5f));
}

TEST_F(SgdTest, MomentumBuffersCannotBeLoadedWithoutMomentum) {
  auto with = create({{"momentum", Value(0.9)}});
  ot::ParameterSet set;
  set.add("w", {2}, true, std::vector<float>{1.0f, 1.0f});
  with->init(set.for_optimizer());
  ot::set_gradient(set.parameters[0], std::vector<float>{1.0f, 1.0f});
  with->step(0.1, 0);
  auto without = create();
  without->init(set.for_optimizer());
  try {
    without->load_state(ot::snapshot(*with));
    ADD_FAILURE() << "accepted";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("momentum 0"), std::string::npos) << e.what();
  }
}

}  // namespace
