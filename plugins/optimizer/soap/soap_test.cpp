// The soap optimizer on its own: its state (moments, statistics and bases per preconditioned
// side), the first gradient setting up the preconditioner without an update, a basis that is
// orthonormal, blocks that behave as separate parameters, and precondition_1d on a vector of more
// than one element (which the PyTorch comparison cannot check: a rank-one first statistic has a
// degenerate eigenspace that two eigensolvers fill differently). The PyTorch comparison (the
// authors' soap.py transcribed, with blocks, merge_dims and precondition_1d) and the state round
// trip are in tests/conformance/optimizer.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "loom/error.hpp"
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

// Values of `full` ([rows, cols], row-major) in rows [r0, r0 + nr) and columns [c0, c0 + nc).
std::vector<float> sub_matrix(const std::vector<float>& full, int cols, int r0, int nr, int c0, int nc) {
  std::vector<float> out;
  for (int r = r0; r < r0 + nr; ++r)
    for (int c = c0; c < c0 + nc; ++c) out.push_back(full[static_cast<std::size_t>(r * cols + c)]);
  return out;
}

// With block_size, each block of a matrix is one SOAP of its own: [6, 10] in blocks of 4 is the
// same as its six blocks ([4, 4], [4, 4], [4, 2], [2, 4], [2, 4], [2, 2]) as separate parameters.
TEST_F(SoapTest, BlocksBehaveAsSeparateParameters) {
  const Value::Map common{
      {"max_precond_dim", Value(16)}, {"precondition_frequency", Value(2)}, {"weight_decay", Value(0.0)}};
  Value::Map blocked_options = common;
  blocked_options.emplace_back("block_size", Value(4));
  auto blocked = create(blocked_options);
  auto separate = create(common);
  std::mt19937 rng(5);
  const int rows = 6, cols = 10;
  const auto w0 = ot::random_values(rng, rows * cols, 1.0f);
  struct Cut {
    int r0, nr, c0, nc;
  };
  const std::vector<Cut> cuts{{0, 4, 0, 4}, {0, 4, 4, 4}, {0, 4, 8, 2}, {4, 2, 0, 4}, {4, 2, 4, 4}, {4, 2, 8, 2}};
  ot::ParameterSet whole, parts;
  whole.backend = parts.backend = backend_.get();
  whole.add("w", {rows, cols}, true, w0);
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const Cut& c = cuts[i];
    parts.add("w" + std::to_string(i), {c.nr, c.nc}, true, sub_matrix(w0, cols, c.r0, c.nr, c.c0, c.nc));
  }
  blocked->init(whole.for_optimizer());
  separate->init(parts.for_optimizer());
  std::map<std::string, loom::Shape> shapes;
  for (const auto& [name, tensor] : blocked->state()) shapes.emplace(name, tensor.shape());
  EXPECT_EQ(shapes.at("GG0/w"), (loom::Shape{6, 4, 4}));  // a shorter block uses the top-left corner
  EXPECT_EQ(shapes.at("Q1/w"), (loom::Shape{6, 4, 4}));
  for (int step = 0; step < 6; ++step) {
    const auto g = ot::random_values(rng, rows * cols, 1.0f);
    ot::set_gradient(whole.parameters[0], g);
    for (std::size_t i = 0; i < cuts.size(); ++i) {
      const Cut& c = cuts[i];
      ot::set_gradient(parts.parameters[i], sub_matrix(g, cols, c.r0, c.nr, c.c0, c.nc));
    }
    blocked->step(0.01, step);
    separate->step(0.01, step);
  }
  const auto w = whole.parameters[0].data().to_vector();
  EXPECT_NE(w, w0);
  for (std::size_t i = 0; i < cuts.size(); ++i) {
    const Cut& c = cuts[i];
    const auto want = parts.parameters[i].data().to_vector();
    const auto got = sub_matrix(w, cols, c.r0, c.nr, c.c0, c.nc);
    for (std::size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-6) << "block " << i << ", " << j;
  }
}

// precondition_1d: a vector of n elements is preconditioned as the [1, n] matrix it equals (whose
// one-element left side is the identity); without it, a vector gets Adam and no statistics.
TEST_F(SoapTest, PreconditionOneDimensionalMatchesARowMatrix) {
  const Value::Map options{{"precondition_1d", Value(true)}, {"precondition_frequency", Value(2)}};
  auto vector_opt = create(options);
  auto matrix_opt = create({{"precondition_frequency", Value(2)}});
  auto adam_opt = create({{"precondition_frequency", Value(2)}});
  std::mt19937 rng(7);
  const auto b0 = ot::random_values(rng, 9, 1.0f);
  ot::ParameterSet vec, row, plain;
  vec.backend = row.backend = plain.backend = backend_.get();
  vec.add("b", {9}, false, b0);
  row.add("b", {1, 9}, false, b0);
  plain.add("b", {9}, false, b0);
  vector_opt->init(vec.for_optimizer());
  matrix_opt->init(row.for_optimizer());
  adam_opt->init(plain.for_optimizer());
  std::vector<std::string> names;
  for (const auto& [name, tensor] : vector_opt->state()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"exp_avg/b", "exp_avg_sq/b", "step/b", "GG0/b", "Q0/b"}));
  EXPECT_EQ(adam_opt->state().size(), 3u);  // exp_avg, exp_avg_sq, step
  for (int step = 0; step < 5; ++step) {
    const auto g = ot::random_values(rng, 9, 1.0f);
    for (auto* set : {&vec, &row, &plain}) ot::set_gradient(set->parameters[0], g);
    vector_opt->step(0.01, step);
    matrix_opt->step(0.01, step);
    adam_opt->step(0.01, step);
  }
  const auto got = vec.parameters[0].data().to_vector();
  const auto want = row.parameters[0].data().to_vector();
  for (std::size_t j = 0; j < want.size(); ++j) EXPECT_NEAR(got[j], want[j], 1e-6) << j;
  EXPECT_NE(got, plain.parameters[0].data().to_vector());  // the preconditioner changes the update
}

// merge_dims turning a whole matrix into one dimension makes it a vector: preconditioned only
// under precondition_1d, like any vector. (Otherwise a [256, 32] embedding with max_precond_dim
// 10000 became one 8192 x 8192 preconditioner, whose set-up eigendecomposition took minutes: a
// fuzzed run that seemed to hang.) A matrix that merges into two dimensions keeps both.
TEST_F(SoapTest, AMatrixMergedIntoOneDimensionIsAVector) {
  auto state_names = [&](const Value::Map& options, std::vector<std::int64_t> shape) {
    auto opt = create(options);
    ot::ParameterSet set;
    set.backend = backend_.get();
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    std::mt19937 rng(11);
    set.add("w", loom::Shape(shape), true, ot::random_values(rng, n, 1.0f));
    opt->init(set.for_optimizer());
    std::map<std::string, loom::Shape> names;
    for (const auto& [name, tensor] : opt->state()) names.emplace(name, tensor.shape());
    return names;
  };
  const Value::Map merged{{"merge_dims", Value(true)}, {"max_precond_dim", Value(100)}};
  EXPECT_EQ(state_names(merged, {8, 4}).size(), 3u);  // [32]: exp_avg, exp_avg_sq, step
  Value::Map merged_1d = merged;
  merged_1d.emplace_back("precondition_1d", Value(true));
  EXPECT_EQ(state_names(merged_1d, {8, 4}).at("GG0/w"), (loom::Shape{32, 32}));
  const auto two = state_names(merged, {2, 3, 40});  // [6, 40]
  EXPECT_EQ(two.at("GG0/w"), (loom::Shape{6, 6}));
  EXPECT_EQ(two.at("GG1/w"), (loom::Shape{40, 40}));
  EXPECT_EQ(state_names({{"max_precond_dim", Value(100)}}, {8, 4}).at("GG1/w"), (loom::Shape{4, 4}));
}

// Statistics that are not finite have no eigenbasis: a clear error naming the parameter, before
// any eigensolver runs (Eigen's would iterate through its whole budget on them).
TEST_F(SoapTest, NonFiniteStatisticsAreAnErrorNamingTheParameter) {
  for (const float bad : {std::nanf(""), INFINITY}) {
    auto opt = create({{"max_precond_dim", Value(16)}});
    ot::ParameterSet set;
    set.backend = backend_.get();
    std::mt19937 rng(13);
    set.add("h.0.mlp.c_fc.weight", {4, 6}, true, ot::random_values(rng, 24, 1.0f));
    opt->init(set.for_optimizer());
    auto g = ot::random_values(rng, 24, 1.0f);
    g[5] = bad;
    ot::set_gradient(set.parameters[0], g);
    try {
      opt->step(0.01, 0);
      ADD_FAILURE() << "no error for " << bad;
    } catch (const loom::UserError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("soap: the preconditioner statistics of 'h.0.mlp.c_fc.weight'"), std::string::npos) << m;
      EXPECT_NE(m.find("the run diverged"), std::string::npos) << m;
    }
  }
}

}  // namespace
