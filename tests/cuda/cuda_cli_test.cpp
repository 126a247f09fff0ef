// The cuda backend plugin as a user meets it on this machine: `loom plugins` lists it whether or
// not there is a GPU (the plugin links no CUDA library; its kernels' library is loaded when the
// backend is created); without a GPU, `loom train ... backend.type=cuda` is one clear message and
// exit 2 before a run directory exists, and `loom conformance` skips every case. On a machine
// with a GPU the refusal tests skip (the device check, benchmarks/cuda/device_check.sh, runs the
// suites there).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "../core/test_support.hpp"
#include "numerics_test_support.hpp"

namespace {

using loom::test::run_command;

const std::string kPlugin = std::string(LOOM_PLUGIN_DIR) + "/libloom-backend-cuda.so";

TEST(CudaPlugin, LoomPluginsListsTheBackend) {
  const auto r = run_command({LOOM_BINARY, "plugins"}, {"LOOM_PLUGIN_PATH="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The backend's row: its name, version and description, and the plugin file.
  const auto row = r.out.find("\n  cuda ");
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find("NVIDIA GPU"), std::string::npos) << line;
  EXPECT_NE(line.find("libloom-backend-cuda.so"), std::string::npos) << line;
}

TEST(CudaPlugin, WithoutAGpuTrainingIsOneClearErrorBeforeTheRunDirectory) {
  const auto why = loom::test::device_unavailable("cuda");
  if (!why) GTEST_SKIP() << "this machine has a CUDA device: the backend is created, not refused";
  loom::test::TempDir dir;
  const auto run_dir = dir.path() / "run";
  const auto config = dir.write("run.yaml",
                                "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 1, num_heads: 2}\n"
                                "tokenizer: byte\n"
                                "data: {type: synthetic, num_documents: 100}\n"
                                "trainer: {num_train_steps: 1, train_batch_size: 2, sample_length: 0}\n");
  const auto r =
      run_command({LOOM_BINARY, "train", config.string(), "backend.type=cuda", "trainer.run_dir=" + run_dir.string()},
                  {"LOOM_PLUGIN_PATH="});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("backend cuda: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("use backend.type: cpu"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

TEST(CudaPlugin, WithoutAGpuTheConformanceSuitesSkipEveryCase) {
  const auto why = loom::test::device_unavailable("cuda");
  if (!why) GTEST_SKIP() << "this machine has a CUDA device: the suites run (the backend-cuda-conformance test)";
  const auto r = run_command({LOOM_BINARY, "conformance", kPlugin}, {"LOOM_PLUGIN_PATH="});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(backend/cuda)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  SKIPPED ] Registered/BackendConformance.MatchesReference/cuda_linear"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("[       OK ]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[  FAILED  ]"), std::string::npos) << r.out;
}

// ---- attention/cuda-flash, the GPU flash-attention kernel.

const std::string kFlashPlugin = std::string(LOOM_PLUGIN_DIR) + "/libloom-attention-cuda-flash.so";

TEST(CudaFlashPlugin, LoomPluginsListsTheKernel) {
  const auto r = run_command({LOOM_BINARY, "plugins"}, {"LOOM_PLUGIN_PATH="});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto row = r.out.find("\n  cuda-flash ");
  ASSERT_NE(row, std::string::npos) << r.out;
  const std::string line = r.out.substr(row + 1, r.out.find('\n', row + 1) - row - 1);
  EXPECT_NE(line.find("FlashAttention-2 on an NVIDIA GPU"), std::string::npos) << line;
  EXPECT_NE(line.find("libloom-attention-cuda-flash.so"), std::string::npos) << line;
}

// The kernel queues on the backend's stream, which it looks up in the backend's kernels' library
// by name (cuda_options.hpp's LOOM_CUDA_STREAM_ENTRY, cuda_flash.cpp's stream_entry).
TEST(CudaFlashPlugin, TheBackendExportsItsStreamForTheKernel) {
  const std::string library = std::string(LOOM_PLUGIN_DIR) + "/cuda-backend-kernels.so";
  void* handle = dlopen(library.c_str(), RTLD_LAZY | RTLD_LOCAL);
  if (!handle) GTEST_SKIP() << "the CUDA libraries cannot be loaded here: " << dlerror();
  EXPECT_NE(dlsym(handle, "loom_cuda_stream"), nullptr) << dlerror();
}

TEST(CudaFlashPlugin, WithoutAGpuTheConformanceSuiteSkipsTheKernel) {
  const auto why = loom::test::device_unavailable("cuda");
  if (!why)
    GTEST_SKIP() << "this machine has a CUDA device: the suite runs (the attention-cuda-flash-conformance test)";
  const auto r = run_command({LOOM_BINARY, "conformance", kFlashPlugin}, {"LOOM_PLUGIN_PATH="});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(attention/cuda-flash)"), std::string::npos) << r.out;
  for (const char* test : {"EveryKernelMatchesNaive", "EveryKernelAccumulatesIntoGradients",
                           "EveryKernelIsDeterministic", "EveryKernelInBf16StaysWithinBf16RoundingOfFloat32"})
    EXPECT_NE(r.out.find(std::string("[  SKIPPED ] AttentionConformance.") + test), std::string::npos) << test << "\n"
                                                                                                       << r.out;
  EXPECT_NE(r.out.find("attention cuda-flash: no CUDA device is available"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[  FAILED  ]"), std::string::npos) << r.out;
}

// Named on a host backend without a GPU: one clear message, exit 2, no run directory; `auto` on
// the host is unaffected (it picks flash: the cpu backend's tests).
TEST(CudaFlashPlugin, WithoutAGpuNamingTheKernelIsOneClearError) {
  const auto why = loom::test::device_unavailable("cuda");
  if (!why) GTEST_SKIP() << "this machine has a CUDA device: the kernel is created (and refused on a host backend)";
  loom::test::TempDir dir;
  const auto run_dir = dir.path() / "run";
  const auto config = dir.write("run.yaml",
                                "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 1, num_heads: 2}\n"
                                "tokenizer: byte\n"
                                "data: {type: synthetic, num_documents: 100}\n"
                                "trainer: {num_train_steps: 1, train_batch_size: 2, sample_length: 0}\n");
  const auto r = run_command(
      {LOOM_BINARY, "train", config.string(), "model.attention=cuda-flash", "trainer.run_dir=" + run_dir.string()},
      {"LOOM_PLUGIN_PATH="});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("while creating attention 'cuda-flash' (model.attention): attention cuda-flash: "),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("use model.attention: auto or flash"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

}  // namespace
