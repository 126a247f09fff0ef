// `loom bench attention` as a user runs it: the table, kernels from a config, and the user errors
// (exit status 2, with the closest valid name).
#include <gtest/gtest.h>

#include "../core/test_support.hpp"

namespace {

using loom::test::run_command;

loom::test::CommandResult loom_bench(std::vector<std::string> args) {
  args.insert(args.begin(), {LOOM_BINARY, "bench"});
  return run_command(args, {"LOOM_PLUGIN_PATH="});
}

// Tiny shapes: the command's plumbing, not the kernels' speed.
const std::vector<std::string> tiny = {"--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1"};

std::vector<std::string> with_tiny(std::vector<std::string> args) {
  args.insert(args.end(), tiny.begin(), tiny.end());
  return args;
}

TEST(AttentionBenchCommand, PrintsOneTablePerLengthWithRatiosAgainstTheFirstKernel) {
  const auto r = loom_bench(with_tiny({"attention", "--kernels", "naive,flash", "--seq-lens", "16,33"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* text :
       {"seq_len 16 ", "seq_len 33 ", "forward ms", "fwd+bwd ms", "peak extra MiB", "  naive ", "  flash ", "1.00x"})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing from\n" << r.out;
  EXPECT_LT(r.out.find("naive"), r.out.find("flash")) << r.out;
}

TEST(AttentionBenchCommand, ComparesComputeDtypesByName) {
  const auto r = loom_bench(with_tiny({"attention", "--kernels", "flash", "--dtypes", "f32,bf16", "--seq-lens", "20"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto f32 = r.out.find(" f32 "), bf16 = r.out.find(" bf16 ");
  ASSERT_NE(f32, std::string::npos) << r.out;
  ASSERT_NE(bf16, std::string::npos) << r.out;
  EXPECT_LT(f32, bf16) << r.out;
  EXPECT_NE(r.out.find("vs f32"), std::string::npos) << r.out;
  const auto bad = loom_bench(with_tiny({"attention", "--kernels", "flash", "--dtypes", "fp8", "--seq-lens", "20"}));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--dtypes"), std::string::npos) << bad.err;
}

TEST(AttentionBenchCommand, TakesTheConfigsKernelWithItsOptionsFirst) {
  loom::test::TempDir dir;
  const auto config = dir.write("model.yaml", "model:\n  attention: {type: flash, block_q: 16, block_kv: 8}\n");
  const auto r = loom_bench(with_tiny({"attention", config.string(), "--kernels", "naive", "--seq-lens", "40"}));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto configured = r.out.find("flash {block_q: 16, block_kv: 8}");
  ASSERT_NE(configured, std::string::npos) << r.out;
  EXPECT_LT(configured, r.out.find("  naive ")) << r.out;
}

TEST(AttentionBenchCommand, BadRequestsAreUserErrors) {
  auto r = loom_bench({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("attention"), std::string::npos) << r.err;
  r = loom_bench({"atention"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'attention'?"), std::string::npos) << r.err;
  r = loom_bench({"attention"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--kernels"), std::string::npos) << r.err;
  r = loom_bench(with_tiny({"attention", "--kernels", "nave", "--seq-lens", "8"}));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'naive'?"), std::string::npos) << r.err;
  r = loom_bench({"attention", "--kernels", "naive", "--seq-lens", "8,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--seq-lens"), std::string::npos) << r.err;
  r = loom_bench({"attention", "--kernels", "naive", "--seq-lens", "8", "--heads", "3", "--kv-heads", "2"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("multiple"), std::string::npos) << r.err;
}

}  // namespace
