// What the distributed tests share: `mpirun -np N loom train ...` and one process side by side,
// their losses and final weights.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../core/test_support.hpp"
#include "loom/safetensors.hpp"

namespace loom::test::distributed {

namespace fs = std::filesystem;
using loom::test::CommandResult;
using loom::test::run_command;

inline const std::vector<std::string> kMpiEnv{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                              "OMPI_MCA_rmaps_base_oversubscribe=1", "LOOM_NUM_THREADS=1"};

inline fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("loom-dist-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

// The tests that compare runs whose float sums associate differently hold them to a float32
// rounding bound: they train with float32 products (the cpu backend's default computes them in
// bf16 where the CPU has AVX512-BF16, which turns a last-bit difference of an operand into a
// bf16 rounding step). The bit-for-bit ones run on the default.
inline const char* const kFloat32Products = "backend.matmul_precision=f32";

inline std::vector<std::string> train_args(const fs::path& run_dir, std::int64_t micro) {
  return {LOOM_BINARY,
          "train",
          std::string(LOOM_SOURCE_DIR) + "/configs/quickstart.yaml",
          "trainer.run_dir=" + run_dir.string(),
          "trainer.num_train_steps=20",
          "trainer.log_every=1",
          "trainer.train_batch_size=8",
          "trainer.microbatch_size=" + std::to_string(micro),
          "trainer.steps_per_eval=0",
          "trainer.max_eval_batches=2",
          "trainer.sample_length=0",
          "trainer.peak_flops=1e11",
          "trainer.trackers=[jsonl]",
          "model.num_layers=2"};
}

// Every mpirun of the tests runs under `timeout`: a run that hangs (a collective the ranks posted
// in different orders) is killed after `seconds`, exit status 124, and fails its test instead of
// blocking the suite (ctest's TIMEOUT then ends only the test, and may leave the ranks behind).
constexpr int kMpirunSeconds = 150;
inline std::vector<std::string> under_timeout(std::vector<std::string> args, int seconds = kMpirunSeconds) {
  args.insert(args.begin(), {LOOM_TIMEOUT, "--kill-after=5", std::to_string(seconds)});
  return args;
}

inline CommandResult mpirun(int ranks, std::vector<std::string> args, std::vector<std::string> env = kMpiEnv,
                            int seconds = kMpirunSeconds) {
  args.insert(args.begin(), {LOOM_MPIRUN, "--oversubscribe", "-np", std::to_string(ranks)});
  return run_command(under_timeout(std::move(args), seconds), env);
}

inline std::vector<double> losses(const fs::path& run_dir) {
  std::vector<double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("train/loss")) out.push_back(j["train/loss"].get<double>());
  }
  return out;
}

inline std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The tensors' bytes, without the header (whose metadata names the run).
inline std::vector<std::pair<std::string, std::vector<float>>> weights(const fs::path& file) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  loom::safetensors::Reader reader(file);
  for (const auto& info : reader.tensors()) {
    const loom::Tensor t = reader.read(info.name);
    out.emplace_back(info.name, std::vector<float>(t.data<float>(), t.data<float>() + t.numel()));
  }
  return out;
}

inline double max_relative_difference(const fs::path& a, const fs::path& b) {
  const auto wa = weights(a), wb = weights(b);
  EXPECT_EQ(wa.size(), wb.size());
  double worst = 0;
  for (std::size_t i = 0; i < wa.size() && i < wb.size(); ++i) {
    EXPECT_EQ(wa[i].first, wb[i].first);
    double scale = 1e-30, diff = 0;
    for (std::size_t k = 0; k < wa[i].second.size(); ++k) {
      scale = std::max(scale, std::abs(static_cast<double>(wa[i].second[k])));
      diff = std::max(diff, std::abs(static_cast<double>(wa[i].second[k]) - wb[i].second[k]));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

}  // namespace loom::test::distributed
