// Run directories written by the tests: what `loom train` writes (config.yaml, metrics.jsonl, the
// final weights of a finished run), with a mixture's per-dataset losses and a benchmark task's
// scores beside; and five runs to compare the way the user did (two learning rates, a wider
// model, two LoRA runs on a quantized base), with a NaN gap, an outlier, a run in progress, a
// diverged run and an MFU above 100%.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "loom/run/report.hpp"

namespace loom::test {

inline void write_file(const std::filesystem::path& file, const std::string& text) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << text;
}

inline std::vector<RunRecord> two_runs(const std::filesystem::path& root) {
  std::vector<RunRecord> runs;
  for (const std::string name : {"alpha", "beta"}) {
    const auto dir = root / name;
    std::filesystem::create_directories(dir);
    const bool alpha = name == "alpha";
    std::ofstream(dir / "config.yaml") << "# <b>bold</b>\nmodel:\n  type: gpt2\n  seq_len: 32\noptimizer:\n  type: "
                                          "adamw\ntrainer:\n  train_batch_size: "
                                       << (alpha ? 4 : 2) << "\n  num_train_steps: 20\n";
    std::ofstream metrics(dir / "metrics.jsonl");
    for (int step = 2; step <= 20; step += 2) {
      const double loss = (alpha ? 5.0 : 5.5) - 0.1 * step;
      metrics << "{\"step\":" << step << ",\"train/loss\":" << loss << ",\"train/lr\":" << 1e-4 * step
              << ",\"train/grad_norm\":" << 2.0 + 0.01 * step << ",\"throughput/tokens_per_second\":" << 1000 + step
              << ",\"throughput/mfu\":" << 0.4 + 0.004 * step << ",\"throughput/elapsed_seconds\":" << 0.5 * step
              << "}\n";
      if (step % 10 == 0)
        metrics << "{\"step\":" << step << ",\"eval/loss\":" << loss + 0.1 << ",\"eval/perplexity\":" << 30 - step
                << ",\"eval/web/loss\":" << loss << ",\"eval/code/loss\":" << loss + 0.2
                << ",\"eval/hellaswag/acc\":" << 0.25 + 0.01 * step
                << ",\"eval/hellaswag/acc_norm\":" << 0.26 + 0.01 * step << "}\n";
    }
    metrics.close();
    std::ofstream(dir / "model.safetensors") << "final weights";
    runs.push_back(read_run(dir));
  }
  return runs;
}

// Holds a run directory's .lock as a training `loom train` does, until destroyed.
class TrainingLock {
 public:
  explicit TrainingLock(const std::filesystem::path& dir)
      : fd_(::open((dir / ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~TrainingLock() { release(); }
  void release() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  TrainingLock(const TrainingLock&) = delete;
  TrainingLock& operator=(const TrainingLock&) = delete;

 private:
  int fd_;
};

// The quickstart's loss falling from `start` to about `floor` over `steps`.
inline double curve(double start, double floor, double rate, int step) {
  return floor + (start - floor) * std::exp(-rate * step);
}

inline std::string quickstart_config(double lr, int hidden, int steps, const std::string& extra = "") {
  std::ostringstream c;
  c << "model:\n  type: gpt2\n  seq_len: 64\n  hidden_dim: " << hidden
    << "\n  num_layers: 2\noptimizer:\n  type: adamw\n  learning_rate: " << lr
    << "\nlr_schedule:\n  type: cosine\n  warmup: 4\ntrainer:\n  train_batch_size: 8\n  num_train_steps: " << steps
    << "\n  run_dir: runs/x\n"
    << extra;
  return c.str();
}

// Metrics of a run logged every 2 steps to `last`, evaluated every 10; `at` may replace a step's
// train/loss text (null: a NaN, 1e30: an outlier).
inline std::string quickstart_metrics(double lr, int hidden, int last, double mfu_scale,
                                      const std::vector<std::pair<int, std::string>>& at = {}) {
  std::ostringstream m;
  m.precision(6);
  const double start = 5.6, floor = 1.2 + 0.5 * 128.0 / hidden, rate = lr * 60;
  for (int step = 2; step <= last; step += 2) {
    std::string loss = std::to_string(curve(start, floor, rate, step));
    for (const auto& [s, text] : at)
      if (s == step) loss = text;
    const double warm = step < 4 ? step / 4.0 : 0.5 * (1 + std::cos(3.14159265 * (step - 4) / 36.0));
    m << "{\"step\":" << step << ",\"train/loss\":" << loss << ",\"train/lr\":" << lr * warm
      << ",\"train/grad_norm\":" << 1.0 + 2.0 / step + lr * 100
      << ",\"throughput/tokens_per_second\":" << 20000.0 * 128 / hidden * (1 + lr)
      << ",\"throughput/mfu\":" << mfu_scale * (0.3 + 0.002 * step) + lr * 10
      << ",\"throughput/elapsed_seconds\":" << 0.4 * step * hidden / 128 << ",\"train/skipped_steps\":0}\n";
    if (step % 10 == 0)
      m << "{\"step\":" << step << ",\"eval/loss\":" << curve(start, floor, rate, step) + 0.15
        << ",\"eval/perplexity\":" << std::exp(curve(start, floor, rate, step) + 0.15)
        << ",\"eval/arc_easy/acc\":" << 0.25 + 0.004 * step * hidden / 128 + lr * 10 << "}\n";
  }
  return m.str();
}

// Five runs: two learning rates (the second with a NaN logged at step 14), a wider model still
// training (its lock held by `lock`) with a loss of 1e30 at step 6, and two LoRA runs on a 4-bit
// and an 8-bit base under `lora/`, both directories named `run`: nf4 diverged (NaN from step 16)
// with an MFU above 100%, int8 stopped at step 12 of 40.
inline std::vector<std::filesystem::path> five_runs(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  const std::vector<fs::path> dirs = {root / "quickstart-lr2e-3", root / "quickstart-lr6e-4", root / "quickstart-wide",
                                      root / "lora" / "run-nf4" / "run", root / "lora" / "run-int8" / "run"};
  write_file(dirs[0] / "config.yaml", quickstart_config(2e-3, 128, 40));
  write_file(dirs[0] / "metrics.jsonl", quickstart_metrics(2e-3, 128, 40, 1));
  write_file(dirs[0] / "model.safetensors", "final weights");
  write_file(dirs[1] / "config.yaml", quickstart_config(6e-4, 128, 40));
  write_file(dirs[1] / "metrics.jsonl", quickstart_metrics(6e-4, 128, 40, 1, {{14, "null"}}));
  write_file(dirs[1] / "model.safetensors", "final weights");
  write_file(dirs[2] / "config.yaml", quickstart_config(2e-3, 256, 40));
  write_file(dirs[2] / "metrics.jsonl", quickstart_metrics(2e-3, 256, 26, 1, {{6, "1e30"}}));
  const std::string lora = "lora:\n  rank: 16\n  alpha: 32\n  target_modules: [q_proj, v_proj]\n  base_dtype: ";
  write_file(dirs[3] / "config.yaml", quickstart_config(1e-3, 128, 40, lora + "nf4\n"));
  write_file(dirs[3] / "metrics.jsonl", quickstart_metrics(1e-3, 128, 18, 3.5, {{16, "null"}, {18, "null"}}));
  write_file(dirs[3] / "header.json",
             "{\"text\": \"model: llama\", \"parameters\": 6738415616, \"flops_per_token\": 43470000000,"
             " \"train_tokens\": 2077000, \"peak_flops\": 1.2e12, \"steps\": 40, \"memory\": \"memory estimate per "
             "rank: 5.1 GiB (parameters 3.6 GiB)\"}");
  write_file(dirs[4] / "config.yaml", quickstart_config(1e-3, 128, 40, lora + "int8\n"));
  write_file(dirs[4] / "metrics.jsonl", quickstart_metrics(1e-3, 128, 12, 1));
  return dirs;
}

}  // namespace loom::test
