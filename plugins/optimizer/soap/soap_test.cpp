// The soap optimizer on its own: its state (moments, statistics and bases per preconditioned
// side), the first gradient setting up the preconditioner without an update, and a basis that is
// orthonormal. The PyTorch comparison (the authors' soap.py transcribed) and the state round trip
// are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "optimizer_test_support.hpp"

namespace {

namespace ot = loom::optimizer_test;
using loom::Value;

class SoapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = ot::load_plugins({LOOM_OPTIMIZER_PLUGIN, LOOM_CPU_BACKEND_PLUGIN});
    backend_ = ot::create_cpu_backend(*registry_);
  }
  loom::Handle<loom::Optimizer> create(const Value::Map& options = {}) {
    return ot::create_optimizer(*registry_, "soap", options);
  }
  std::unique_ptr<loom::Registry> registry_;
  loom::Handle<loom::Backend> backend_;
};

TEST_F(SoapTest, FirstGradientSetsUpAnOrthonormalBasisWithoutUpdating) {
  auto opt = create({{"max_precond_dim", Value(4)}});
  ot::ParameterSet set;
  set.backend = backend_.get();
  std::mt19937 rng(3);
  const auto w0 = ot::random_values(rng, 3 * 8, 1.0f);
  set.add("w", {3, 8}, true, w0);  // left side 3 <= 4: preconditioned; right side 8 > 4: not
  set.add("b", {8}, false, std::vector<float>(8, 0.5f));
  opt->init(set.for_optimizer());
  std::vector<std::string> names;
  for (const auto& [name, tensor] : opt->state()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"exp_avg/w", "exp_avg_sq/w", "step/w", "GG0/w", "Q0/w", "exp_avg/b",
                                             "exp_avg_sq/b", "step/b"}));
  ot::set_gradient(set.parameters[0], ot::random_values(rng, 24, 1.0f));
  ot::set_gradient(set.parameters[1], ot::random_values(rng, 8, 1.0f));
  opt->step(0.1, 0);
  EXPECT_EQ(set.parameters[0].data().to_vector(), w0);
  EXPECT_EQ(set.parameters[1].data().to_vector(), std::vector<float>(8, 0.5f));
  for (const auto& [name, tensor] : opt->state()) {
    if (name != "Q0/w") continue;
    const auto q = tensor.to_vector();
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 3; ++j) {
        double dot = 0;
        for (int k = 0; k < 3; ++k) dot += static_cast<double>(q[k * 3 + i]) * q[k * 3 + j];
        EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << i << ", " << j;
      }
  }
  ot::set_gradient(set.parameters[0], ot::random_values(rng, 24, 1.0f));
  ot::set_gradient(set.parameters[1], ot::random_values(rng, 8, 1.0f));
  opt->step(0.1, 1);
  EXPECT_NE(set.parameters[0].data().to_vector(), w0);
}

}  // namespace
