// A run's directory: where its config, tokenizer state, metrics, weights and (by default)
// checkpoints go. The directory of a finished run is what `loom generate` loads.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/kinds/model.hpp"
#include "loom/options.hpp"
#include "loom/value.hpp"

namespace loom::training {

// How a run ended, as end.json records it: "finished", "diverged" (a NaN or infinite loss or
// gradient norm under trainer.crash_on_nan / crash_on_inf), "stopped" (SIGTERM or SIGINT, after
// saving a checkpoint) or "error" (any other error). `step`: the steps done; for "diverged" the
// step whose loss or norm was not finite (counted from 1, as metrics.jsonl counts).
struct RunEnd {
  std::string status;
  std::int64_t step = 0;
  std::int64_t num_steps = 0;  // trainer.num_train_steps
  std::string reason;          // short, for `loom report`: "NaN loss", "SIGTERM", the error's message
  std::string message;         // the error, or what stopped the run; empty for "finished"
};

class RunDirectory {
 public:
  RunDirectory() = default;

  // Names the run (trainer.run_id, else the config file's name and the start time) and its
  // directory (trainer.run_dir, else runs/<run_id>), creates the directory and locks it (the
  // lock file `.lock`, held while the process lives; it names this process's pid and those of
  // `peers`, the run's other ranks on this host): a directory that another loom process holds
  // (any rank of another run) is a UserError naming the pids that hold it. Whether an existing
  // run may continue here is resume's decision (train/resume.hpp); nothing else is written yet.
  static RunDirectory open(const Options& trainer, const Value& config, const std::vector<int>& peers = {});
  // The ranks other than 0: hold the lock of `dir` (which rank 0 opened) beside rank 0 while they
  // live, so that a second run is refused while any rank of this one is still there (rank 0 gone,
  // its launcher killed). A UserError when another run took it meanwhile; nothing where `dir`
  // has no lock file (a rank on a host that does not share the run's file system).
  void share_lock(const std::filesystem::path& dir);

  const std::filesystem::path& path() const { return path_; }
  const std::string& run_id() const { return run_id_; }
  // A resumed run keeps the name it had, unless trainer.run_id names it.
  void adopt_run_id(std::string run_id) { run_id_ = std::move(run_id); }

  // A run was trained here before: it left metrics or weights.
  bool holds_run() const;
  // ... and finished: it left its final weights.
  bool holds_final_weights() const;

  // config.yaml: the resolved `config` (replaced atomically on resume).
  void write_config(const Value& config) const;
  // tokenizer.state, when the tokenizer has a state (a vocabulary fitted to the training data)
  // that `loom generate` needs back.
  void write_tokenizer_state(const std::string& state) const;
  // model.safetensors: the weights after `step` steps; `average` says they are the weight
  // average (trainer.ema_decay), recorded as "loom.weights": "ema" (else "live") in its metadata.
  void save_weights(const std::vector<ModelParameter>& parameters, std::int64_t step, bool average) const;
  // end.json: how the run ended (with the time, UTC), replaced atomically and durably.
  void write_end(const RunEnd& end) const;
  // Removes an earlier run's end.json, as a resumed run starts: while it trains there is none.
  void clear_end() const;

 private:
  std::filesystem::path path_;
  std::string run_id_;
  std::shared_ptr<int> lock_;  // the locked file descriptor, closed with the last copy
};

// The text of config.yaml for `config`: a comment line naming the run, then the YAML.
std::string config_file_text(const std::string& run_id, const Value& config);

}  // namespace loom::training
