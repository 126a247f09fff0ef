// `loom bench gemm` as a user runs it: one table per GEMM shape with the library baselines and
// bf16's speed-up, the float32 fallback of a backend without bf16 kernels said in the table, and
// the user errors (exit status 2, with the closest valid name).
#include <gtest/gtest.h>

#include "../core/test_support.hpp"

namespace {

using loom::test::run_command;

loom::test::CommandResult loom_bench(std::vector<std::string> args) {
  args.insert(args.begin(), {LOOM_BINARY, "bench"});
  return run_command(args, {"LOOM_PLUGIN_PATH="});
}

TEST(GemmBenchCommand, PrintsOneTablePerShapeWithLibraryAndF32Ratios) {
  // 16 tokens: the command's plumbing, not the kernels' speed.
  const auto r = loom_bench({"gemm", "--backends", "cpu,reference", "--dtypes", "f32,bf16", "--tokens", "16",
                             "--shapes", "attn_out,mlp_up_dW", "--repeats", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* text : {"attn_out  (m 16, n 768, k 768,", "mlp_up_dW  (m 768, n 3072, k 16, A^T,", "GFLOP/s",
                           "vs library", "vs f32", "\n  cpu ", "\n  openblas ", " bf16 "})
    EXPECT_NE(r.out.find(text), std::string::npos) << text << " missing from\n" << r.out;
  EXPECT_LT(r.out.find("attn_out"), r.out.find("mlp_up_dW")) << r.out;
  // reference has no bf16 kernels: its bf16 rows are the float32 fallback, and the table says so.
  EXPECT_NE(r.out.find("\n  reference (fallback) "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("no bf16 kernels on this CPU"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("qkv"), std::string::npos) << "only the shapes asked for\n" << r.out;
}

// int8 and nf4: the product with a stored weight, against the same backend's f32; none for the
// weight-gradient shape (A^T).
TEST(GemmBenchCommand, StoredWeightRowsAgainstF32) {
  const auto r = loom_bench({"gemm", "--dtypes", "f32,int8,nf4", "--tokens", "16", "--shapes",
                             "attn_out,mlp_up_dW,lm_head", "--repeats", "1", "--no-libraries"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::size_t dw = r.out.find("mlp_up_dW"), head = r.out.find("lm_head  (");
  ASSERT_NE(dw, std::string::npos) << r.out;
  ASSERT_NE(head, std::string::npos) << r.out;
  for (const char* text : {"\n  cpu       int8 ", "\n  cpu        nf4 "}) {
    EXPECT_LT(r.out.find(text), dw) << text << " missing for attn_out in\n" << r.out;
    EXPECT_NE(r.out.find(text, head), std::string::npos) << text << " missing for lm_head in\n" << r.out;
    EXPECT_EQ(r.out.substr(dw, head - dw).find(text), std::string::npos) << "no stored row for A^T\n" << r.out;
  }
  EXPECT_NE(r.out.find("int8, nf4: the product with B stored in that format"), std::string::npos) << r.out;
}

// A device backend (the test device `guarded`, memory the host cannot touch: a host access would
// be a SIGSEGV) is timed on operands copied to its memory, each product waited for.
TEST(GemmBenchCommand, TimesADeviceBackendOnOperandsInItsMemory) {
  const auto r = run_command({LOOM_BINARY, "bench", "gemm", "--backends", "guarded", "--dtypes", "f32,bf16", "--tokens",
                              "8", "--shapes", "attn_out", "--repeats", "1", "--no-libraries"},
                             {"LOOM_PLUGIN_PATH=" + std::string(LOOM_FIXTURE_DIR) + "/devices"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("attn_out  (m 8, n 768, k 768,"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\n  guarded"), std::string::npos) << r.out;
  // A stored weight's product dequantizes on the host: refused, naming the dtype.
  const auto q = run_command({LOOM_BINARY, "bench", "gemm", "--backends", "guarded", "--dtypes", "int8", "--tokens",
                              "8", "--shapes", "attn_out", "--repeats", "1"},
                             {"LOOM_PLUGIN_PATH=" + std::string(LOOM_FIXTURE_DIR) + "/devices"});
  EXPECT_EQ(q.exit_code, 2) << q.out << q.err;
  EXPECT_NE(q.err.find("int8/nf4"), std::string::npos) << q.err;
}

TEST(GemmBenchCommand, BadRequestsAreUserErrors) {
  auto r = loom_bench({"gem"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'gemm'?"), std::string::npos) << r.err;
  r = loom_bench({"gemm", "--dtypes", "f32,f16", "--tokens", "16"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown dtype 'f16' (f32 or bf16: the compute dtype; int8 or nf4"), std::string::npos) << r.err;
  r = loom_bench({"gemm", "--shapes", "qvk", "--tokens", "16"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'qkv'?"), std::string::npos) << r.err;
  r = loom_bench({"gemm", "--tokens", "0"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokens must be positive"), std::string::npos) << r.err;
  r = loom_bench({"gemm", "--backends", "cpuu", "--tokens", "16", "--shapes", "attn_out"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("cpuu"), std::string::npos) << r.err;
}

}  // namespace
