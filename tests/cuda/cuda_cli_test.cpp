// The cuda backend plugin as a user meets it on this machine: `loom plugins` lists it whether or
// not there is a GPU (the plugin links no CUDA library; its kernels' library is loaded when the
// backend is created); without a GPU, `loom train ... backend.type=cuda` is one clear message and
// exit 2 before a run directory exists, and `loom conformance` skips every case. On a machine
// with a GPU the refusal tests skip (the device check, benchmarks/cuda/device_check.sh, runs the
// suites there).
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

}  // namespace
