// The trainer's side of checkpoints: trainer.checkpoint's options, when the step loop saves,
// and what a checkpoint of a run holds (see docs/checkpoints.md for the layout).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/options.hpp"

namespace loom::training {

struct Run;

// trainer.checkpoint.
struct CheckpointSettings {
  std::int64_t save_every_steps = 0;  // 0: no step policy
  double save_every_minutes = 0;      // 0: no time policy
  checkpoint::Retention retention;
  std::filesystem::path dir;  // trainer.checkpoint.dir, else <run_dir>/checkpoints
  bool async = true;
  bool periodic() const { return save_every_steps > 0 || save_every_minutes > 0; }
};

CheckpointSettings checkpoint_settings(const Options& trainer, const std::filesystem::path& run_dir);

// When the step loop saves: every save_every_steps steps, at every multiple of keep_every_steps
// (the permanent ones), and whenever save_every_minutes have passed since the last save (or the
// start), checked at step boundaries.
class CheckpointPolicy {
 public:
  using Clock = std::chrono::steady_clock;
  CheckpointPolicy(const CheckpointSettings& settings, Clock::time_point start)
      : settings_(settings), last_save_(start) {}
  bool due(std::int64_t steps_done, Clock::time_point now) const;
  // Whether a save may come soon enough that the writer should prepare its buffers: from the
  // start under a step policy, half way to the first save under the time policy alone.
  bool soon(Clock::time_point now) const;
  void saved(Clock::time_point now) { last_save_ = now; }

 private:
  CheckpointSettings settings_;
  Clock::time_point last_save_;
};

// The run as it stands, for a checkpoint: its record (state.json) and a snapshot whose tensors
// are the live parameters and optimizer state (the writer copies them when it writes later).
checkpoint::TrainRecord train_record(const Run& run, double elapsed_seconds);
checkpoint::Snapshot live_snapshot(const Run& run, const checkpoint::TrainRecord& record);

// The log line of a checkpoint moved aside because it failed verification.
std::string describe_set_aside(const checkpoint::SetAside& set_aside);

// "crc32c:<8 hex digits>" of a config.yaml's text.
std::string config_hash(const std::string& config_text);

// "1.49 GB", "12.3 MB", "830 kB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace loom::training
