// Every operation of every registered backend against `reference`: values, and gradients in
// three modes (all inputs trainable; operations applied twice so gradients accumulate; every
// other input frozen), on three random shapes per operation.
#include <gtest/gtest.h>

#include <algorithm>

#include "op_cases.hpp"

namespace loom::test {
namespace {

// A backend with a `kernels` option (sets of kernels for several instruction sets, the cpu
// backend's baseline and avx512) is tested with each choice but auto that this CPU can run, so
// every set is checked on a CPU that has the widest: "cpu", "cpu:baseline", "cpu:avx512".
std::vector<std::string> backends_under_test() {
  std::vector<std::string> names;
  for (const auto& n : registered("backend")) {
    if (n == "reference") continue;
    names.push_back(n);
    const ComponentEntry* entry = plugin_registry().find("backend", n);
    const OptionSpec* kernels = entry ? entry->decl.options.find("kernels") : nullptr;
    if (!kernels) continue;
    for (const auto& choice : kernels->choices()) {
      if (choice == "auto") continue;
      Value options = Value::map();
      options.set("type", n);
      options.set("kernels", choice);
      try {
        make_backend(n, nullptr, options);  // refused where the CPU lacks the instruction set
      } catch (const UserError&) {
        continue;
      }
      names.push_back(n + ":" + choice);
    }
  }
  return names;
}

// "cpu:avx512" -> the backend "cpu" with kernels: avx512, computing float32 products.
Handle<Backend> make_backend_under_test(const std::string& spec) {
  const auto colon = spec.find(':');
  Value options = Value::map();
  if (colon != std::string::npos) options.set("kernels", spec.substr(colon + 1));
  return make_f32_backend(spec.substr(0, colon), nullptr, options);
}

using Param = std::tuple<std::string, std::string>;  // backend, operation

class BackendConformance : public ::testing::TestWithParam<Param> {};

TEST_P(BackendConformance, MatchesReference) {
  const auto& [backend_name, case_name] = GetParam();
  const std::string name = backend_name.substr(0, backend_name.find(':'));
  if (const auto why = device_unavailable(name)) GTEST_SKIP() << *why;
  const OpCase& c = op_case(case_name);
  // The float32 contract, at float32 tolerances: a backend with a mixed-precision option runs
  // with matmul_precision: f32 (the bf16 products have their own cases, backend_bf16_test.cpp).
  Handle<Backend> backend = make_backend_under_test(backend_name);
  if (const auto why = case_cannot_run(*backend, c)) GTEST_SKIP() << *why;
  Handle<Backend> reference = make_backend("reference");
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    Dims dims(seed);
    const CaseData data = c.make(dims);
    for (Mode mode : {Mode::all, Mode::twice, Mode::frozen}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + ", mode " + std::to_string(static_cast<int>(mode)));
      const Evaluation got = evaluate(*backend, c, data, mode, true);
      const Evaluation want = evaluate(*reference, c, data, mode, true);
      ASSERT_EQ(got.outputs.size(), want.outputs.size());
      for (std::size_t i = 0; i < got.outputs.size(); ++i)
        EXPECT_TRUE(all_close(got.outputs[i], want.outputs[i], c.rtol)) << "output " << i;
      ASSERT_EQ(got.grads.size(), want.grads.size());
      for (std::size_t i = 0; i < got.grads.size(); ++i) {
        EXPECT_EQ(got.grads[i].empty(), want.grads[i].empty()) << "gradient " << i << " presence";
        EXPECT_TRUE(all_close(got.grads[i], want.grads[i], c.rtol)) << "gradient of input " << i;
      }
      if (mode == Mode::frozen) {
        for (std::size_t i = 1; i < got.grads.size(); i += 2) {
          EXPECT_TRUE(got.grads[i].empty()) << "a frozen input got a gradient";
        }
      }
    }
  }
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  std::string name = std::get<0>(info.param);
  std::replace(name.begin(), name.end(), ':', '_');
  name += '_';
  name += std::get<1>(info.param);
  return name;
}

INSTANTIATE_TEST_SUITE_P(Registered, BackendConformance,
                         ::testing::Combine(::testing::ValuesIn(backends_under_test()),
                                            ::testing::ValuesIn(op_case_names())),
                         param_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BackendConformance);

}  // namespace
}  // namespace loom::test
