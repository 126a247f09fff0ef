// Determinism, operation by operation: every registered backend gives bit-identical values and
// gradients when run twice (the contract); the cpu backend also gives the same bits on one
// thread and on three (its reductions use fixed chunks, whatever the thread count), in its
// default precision and in float32.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "op_cases.hpp"

namespace loom::test {
namespace {

void expect_bitwise(const Evaluation& a, const Evaluation& b) {
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  for (std::size_t i = 0; i < a.outputs.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.outputs[i], b.outputs[i])) << "output " << i;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << "gradient " << i;
}

class Determinism : public ::testing::TestWithParam<std::string> {};

TEST_P(Determinism, RepeatedRunsAreBitIdentical) {
  // A backend whose device this machine lacks is skipped; when that leaves only the oracle (`loom
  // conformance` on a GPU backend without a GPU), so is the test.
  std::optional<std::string> unavailable;
  bool checked_other_than_reference = false;
  for (const std::string& name : registered("backend")) {
    SCOPED_TRACE(name);
    if (auto why = device_unavailable(name)) {
      unavailable = why;
      continue;
    }
    Handle<Backend> backend = make_backend(name);
    const OpCase& c = op_case(GetParam());
    if (const auto why = case_cannot_run(*backend, c)) {
      unavailable = why;
      continue;
    }
    Dims dims(7);
    const CaseData data = c.make(dims);
    expect_bitwise(evaluate(*backend, c, data, Mode::twice, true), evaluate(*backend, c, data, Mode::twice, true));
    checked_other_than_reference = checked_other_than_reference || name != "reference";
  }
  if (unavailable && !checked_other_than_reference) GTEST_SKIP() << *unavailable;
}

TEST_P(Determinism, CpuIsIndependentOfTheThreadCount) {
  auto one = make_execution_context(1);
  auto three = make_execution_context(3);
  const OpCase& c = op_case(GetParam());
  // The default precision (bf16 products where the CPU has AVX512-BF16), then float32.
  for (const std::string precision : {"", "f32"}) {
    SCOPED_TRACE("matmul_precision " + (precision.empty() ? std::string("default") : precision));
    Value fine = Value::map();  // split even these small problems into chunks
    fine.set("grain", 256);
    if (!precision.empty()) fine.set("matmul_precision", precision);
    Handle<Backend> serial = make_backend("cpu", one.get(), fine);
    Handle<Backend> parallel = make_backend("cpu", three.get(), fine);
    for (std::uint64_t seed = 1; seed <= 2; ++seed) {
      Dims dims(seed);
      const CaseData data = c.make(dims);
      expect_bitwise(evaluate(*serial, c, data, Mode::twice, true), evaluate(*parallel, c, data, Mode::twice, true));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Operations, Determinism, ::testing::ValuesIn(op_case_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) { return info.param; });

}  // namespace
}  // namespace loom::test
