// Finite-difference checks of every operation's backward pass, on `reference` (float64 inside,
// so central differences of its float32 outputs are accurate to about 1e-4).
#include <gtest/gtest.h>

#include <cmath>
#include <loom/random.hpp>

#include "op_cases.hpp"

namespace loom::test {
namespace {

// sum_i <output_i, seed_i>: the function whose gradient the backward pass computes.
double objective(Backend& backend, const OpCase& c, const CaseData& data) {
  const Evaluation e = evaluate(backend, c, data, Mode::all, false);
  double f = 0.0;
  for (std::size_t i = 0; i < e.outputs.size(); ++i) {
    const Shape shape{static_cast<std::int64_t>(e.outputs[i].size())};
    const std::vector<float> seed = output_seed(shape, i).to_vector();
    for (std::size_t j = 0; j < seed.size(); ++j) f += static_cast<double>(e.outputs[i][j]) * seed[j];
  }
  return f;
}

class GradientCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradientCheck, ReferenceMatchesFiniteDifferences) {
  const OpCase& c = op_case(GetParam());
  Handle<Backend> reference = make_backend("reference");
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    Dims dims(seed + 100);
    const CaseData data = c.make(dims);
    const Evaluation analytic = evaluate(*reference, c, data, Mode::all, true);
    for (std::size_t p = 0; p < data.params.size(); ++p) {
      const std::vector<float>& g = analytic.grads[p];
      ASSERT_EQ(static_cast<std::int64_t>(g.size()), data.params[p].numel()) << "input " << p << " got no gradient";
      double scale = 1e-3;
      for (float v : g) scale = std::max(scale, std::fabs(static_cast<double>(v)));
      // A few coordinates per input, chosen at random.
      const int probes = static_cast<int>(std::min<std::int64_t>(6, data.params[p].numel()));
      for (int probe = 0; probe < probes; ++probe) {
        const auto idx =
            static_cast<std::int64_t>(random_bits(stream_key(seed, 5, p), static_cast<std::uint32_t>(probe)) %
                                      static_cast<std::uint32_t>(data.params[p].numel()));
        auto shifted = [&](double delta) {
          CaseData moved = data;
          moved.params[p] = data.params[p].clone();
          moved.params[p].data<float>()[idx] += static_cast<float>(delta);
          return objective(*reference, c, moved);
        };
        const double h = c.fd_step;
        const double numeric = (shifted(h) - shifted(-h)) / (2.0 * h);
        const double exact = g[static_cast<std::size_t>(idx)];
        EXPECT_LE(std::fabs(numeric - exact), c.fd_tol * (scale + std::fabs(exact)))
            << "input " << p << " element " << idx << ": finite difference " << numeric << ", backward " << exact
            << " (seed " << seed << ")";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Operations, GradientCheck, ::testing::ValuesIn(op_case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace loom::test
