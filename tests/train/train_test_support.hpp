// Helpers the trainer's end-to-end tests share: train a config with overrides and read back what
// the run wrote.
#pragma once

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/runtime.hpp"
#include "loom/run/trainer.hpp"
#include "loom/safetensors.hpp"

namespace loom::test {

struct TrainedRun {
  TrainSummary summary;
  std::string log;            // what the run printed
  std::filesystem::path dir;  // its run directory
};

// Trains `config` with `overrides` (KEY=VALUE) in `run_dir` (trainer.run_dir, and trainer.run_id
// its last component), keeping what it prints.
inline TrainedRun train_in(const std::filesystem::path& config, const std::filesystem::path& run_dir,
                           std::vector<std::string> overrides = {}) {
  overrides.push_back("trainer.run_dir=" + run_dir.string());
  overrides.push_back("trainer.run_id=" + run_dir.filename().string());
  RuntimeOptions options;
  options.config = config;
  options.overrides = std::move(overrides);
  Runtime runtime(options);
  std::ostringstream out;
  TrainOptions train_options;
  train_options.out = &out;
  TrainedRun run{train(runtime, train_options), "", run_dir};
  run.log = out.str();
  return run;
}

// The records of a run's metrics.jsonl, in order.
inline std::vector<nlohmann::json> read_metrics(const std::filesystem::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

// Every value of every tensor of a safetensors file, in the file's tensor order.
inline std::vector<float> all_weights(const std::filesystem::path& file) {
  safetensors::Reader reader(file);
  std::vector<float> values;
  for (const auto& info : reader.tensors()) {
    const auto v = reader.read(info.name).to_vector();
    values.insert(values.end(), v.begin(), v.end());
  }
  return values;
}

}  // namespace loom::test
