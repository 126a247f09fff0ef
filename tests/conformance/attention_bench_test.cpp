// `loom bench attention`'s measuring code (loom_run), on the build's attention kernels.
#include <gtest/gtest.h>

#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/error.hpp>
#include <loom/execution.hpp>
#include <loom/run/attention_bench.hpp>
#include <string>

namespace {

loom::Registry& registry() {
  static loom::Registry* r = [] {
    auto* reg = new loom::Registry;
    static auto context = loom::make_execution_context(2);
    reg->set_execution_context(context.get());
    loom::PluginHost host;
    host.load({{LOOM_PLUGIN_DIR, "test"}}, *reg);
    return reg;
  }();
  return *r;
}

// `loom bench attention`'s measuring code on a small problem: every kernel at every length,
// with naive's score matrices showing in its peak extra memory and flash's tiles far below.
TEST(AttentionBench, MeasuresEveryKernelAtEveryLength) {
  loom::AttentionBenchOptions o;
  o.kernels = {{"attention", "naive", loom::Value(), "--kernels"}, {"attention", "flash", loom::Value(), "--kernels"}};
  o.seq_lens = {40, 400};
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 16;
  o.repeats = 1;
  const auto results = loom::run_attention_bench(registry(), o);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].kernel, "naive");
  EXPECT_EQ(results[3].kernel, "flash");
  EXPECT_EQ(results[2].seq_len, 400);
  for (const auto& r : results) {
    EXPECT_GT(r.forward_ms, 0.0);
    EXPECT_GE(r.forward_backward_ms, 0.0);
  }
  // naive holds at least one 400 x 400 score matrix; flash a few 64 x 64 tiles, D and (with so
  // few heads to share among the threads) dq partials, all linear in the length.
  EXPECT_GE(results[2].peak_extra_bytes, 400u * 400u * sizeof(float));
  EXPECT_LT(results[3].peak_extra_bytes, results[2].peak_extra_bytes / 2);
  const std::string table = loom::format_attention_bench(o, results, 2);
  EXPECT_NE(table.find("seq_len 400"), std::string::npos) << table;
  EXPECT_NE(table.find("fwd+bwd ms"), std::string::npos) << table;
  EXPECT_NE(table.find("flash"), std::string::npos) << table;
}

// Each kernel in each compute dtype: naive has no bf16 path, so its bf16 row is marked as the
// float32 result; flash's is not where the CPU has AVX512-BF16.
TEST(AttentionBench, ComparesComputeDtypesPerKernel) {
  loom::AttentionBenchOptions o;
  o.kernels = {{"attention", "flash", loom::Value(), "--kernels"}, {"attention", "naive", loom::Value(), "--kernels"}};
  o.dtypes = {loom::DType::f32, loom::DType::bf16};
  o.seq_lens = {70};
  o.batch = 1;
  o.heads = 2;
  o.head_dim = 16;
  o.repeats = 1;
  const auto results = loom::run_attention_bench(registry(), o);
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(results[0].kernel, "flash");
  EXPECT_EQ(results[0].dtype, loom::DType::f32);
  EXPECT_EQ(results[1].kernel, "flash");
  EXPECT_EQ(results[1].dtype, loom::DType::bf16);
  EXPECT_EQ(results[3].kernel, "naive");
  EXPECT_EQ(results[3].dtype, loom::DType::bf16);
  EXPECT_FALSE(results[0].fallback);
  EXPECT_TRUE(results[3].fallback);
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool bf16 =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
#else
  const bool bf16 = false;
#endif
  EXPECT_EQ(results[1].fallback, !bf16);
  const std::string table = loom::format_attention_bench(o, results, 2);
  EXPECT_NE(table.find("vs f32"), std::string::npos) << table;
  EXPECT_NE(table.find("naive (fallback)  bf16"), std::string::npos) << table;
  o.dtypes.clear();
  EXPECT_THROW(loom::run_attention_bench(registry(), o), loom::UserError);
}

TEST(AttentionBench, RejectsInvalidOptionsWithUserErrors) {
  loom::AttentionBenchOptions o;
  o.seq_lens = {8};
  EXPECT_THROW(loom::run_attention_bench(registry(), o), loom::UserError);  // no kernel
  o.kernels = {{"attention", "naive", loom::Value(), "--kernels"}};
  o.heads = 3;
  o.kv_heads = 2;
  EXPECT_THROW(loom::run_attention_bench(registry(), o), loom::UserError);
  o.kv_heads = 0;
  o.seq_lens = {0};
  EXPECT_THROW(loom::run_attention_bench(registry(), o), loom::UserError);
  o.seq_lens = {8};
  o.kernels = {{"attention", "flsh", loom::Value(), "--kernels"}};
  try {
    loom::run_attention_bench(registry(), o);
    ADD_FAILURE() << "an unknown kernel was accepted";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("flash"), std::string::npos) << e.what();  // the closest name
  }
}

}  // namespace
