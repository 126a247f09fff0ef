// Same seed and thread count give bit-identical losses and gradients; with the cpu backend's
// fixed reduction chunks and GEMMs split along m or n, the thread count does not matter either.
#include <gtest/gtest.h>

#include "numerics_test_support.hpp"
#include "tiny_model.hpp"

namespace loom::test {
namespace {

struct StepResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;
};

StepResult train_steps(Backend& backend, int steps) {
  const Handle<AttentionKernel> attention = attention_for(backend);
  TinyModel model({}, 1, backend.device());
  Tape tape;
  Ops ops(backend, &tape);
  StepResult r;
  for (int s = 0; s < steps; ++s) {
    auto [tokens, targets] = model.batch(static_cast<std::uint64_t>(s));
    ops.set_dropout_seed(5, static_cast<std::uint64_t>(s));
    Tensor loss = model.loss(ops, *attention, tokens, targets);
    r.losses.push_back(loss.item());
    tape.backward(loss);
    // A plain SGD step so that later steps depend on earlier gradients.
    for (Parameter& p : model.parameters())
      if (p.has_grad())
        backend.scale(p.grad().device_data<float>(), -0.05f, p.data().device_data<float>(), p.grad().numel(), true);
    if (s + 1 < steps)
      for (Parameter& p : model.parameters()) p.zero_grad();
  }
  for (Parameter& p : model.parameters()) r.grads.push_back(p.grad().to_vector());
  return r;
}

TEST(Determinism, RepeatedRunsAreBitIdentical) {
  for (const std::string& name : registered("backend")) {
    SCOPED_TRACE(name);
    if (device_unavailable(name)) continue;  // a GPU backend on a machine without one
    Handle<Backend> backend = make_backend(name);
    if (!attention_for(*backend)) continue;  // no attention kernel computes on its device yet
    const StepResult a = train_steps(*backend, 3);
    const StepResult b = train_steps(*backend, 3);
    EXPECT_TRUE(bitwise_equal(a.losses, b.losses));
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (std::size_t i = 0; i < a.grads.size(); ++i)
      EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << "param " << i;
    // Training actually moved: the losses differ from step to step.
    EXPECT_NE(a.losses[0], a.losses[2]);
  }
}

TEST(Determinism, CpuResultsDoNotDependOnTheThreadCount) {
  auto one = make_execution_context(1);
  auto three = make_execution_context(3);
  // The default precision (bf16 products where the CPU has AVX512-BF16), then float32.
  for (const std::string precision : {"", "f32"}) {
    SCOPED_TRACE("matmul_precision " + (precision.empty() ? std::string("default") : precision));
    // Small chunks even for this small model, so that every kernel runs split (GEMM splitting is
    // covered by cpu_backend_test.cpp, on shapes large enough to be split).
    Value fine = Value::map();
    fine.set("grain", 256);
    if (!precision.empty()) fine.set("matmul_precision", precision);
    Handle<Backend> serial = make_backend("cpu", one.get(), fine);
    Handle<Backend> parallel = make_backend("cpu", three.get(), fine);
    const StepResult a = train_steps(*serial, 2);
    const StepResult b = train_steps(*parallel, 2);
    EXPECT_TRUE(bitwise_equal(a.losses, b.losses));
    for (std::size_t i = 0; i < a.grads.size(); ++i)
      EXPECT_TRUE(bitwise_equal(a.grads[i], b.grads[i])) << "param " << i;
  }
}

// Against the float64 oracle at float32 tolerances: the cpu backend in float32 (its default
// computes the products in bf16 where the CPU can; the runs above check that default).
TEST(Determinism, CpuMatchesReferenceOnTheWholeModel) {
  Handle<Backend> cpu = make_f32_backend("cpu");
  Handle<Backend> ref = make_backend("reference");
  const StepResult a = train_steps(*cpu, 2);
  const StepResult b = train_steps(*ref, 2);
  EXPECT_TRUE(all_close(a.losses, b.losses, 1e-4));
  for (std::size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(all_close(a.grads[i], b.grads[i], 2e-3)) << "param " << i;
}

}  // namespace
}  // namespace loom::test
