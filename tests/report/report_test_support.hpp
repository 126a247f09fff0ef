// Two runs' directories written by the test: what `loom train` writes, with a mixture's per-dataset
// losses and a benchmark task's scores (the future trainer.eval_tasks) beside.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "loom/run/report.hpp"

namespace loom::test {

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
              << ",\"throughput/mfu\":" << 0.4 + 0.004 * step << "}\n";
      if (step % 10 == 0)
        metrics << "{\"step\":" << step << ",\"eval/loss\":" << loss + 0.1 << ",\"eval/perplexity\":" << 30 - step
                << ",\"eval/web/loss\":" << loss << ",\"eval/code/loss\":" << loss + 0.2
                << ",\"eval/hellaswag/acc\":" << 0.25 + 0.01 * step
                << ",\"eval/hellaswag/acc_norm\":" << 0.26 + 0.01 * step << "}\n";
    }
    metrics.close();
    runs.push_back(read_run(dir));
  }
  return runs;
}

}  // namespace loom::test
