// The trainer's side of checkpoints: trainer.checkpoint's options, when the step loop saves,
// and what a checkpoint of a run holds (see docs/checkpoints.md for the layout).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/options.hpp"

namespace loom::training {

struct Run;
class World;

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

// "slot/parameter" (an optimizer state entry) or "ema/parameter" (the weight average's): the
// parameter's name; a parameter's own entry is its name.
std::string parameter_of(const std::string& entry);

// A checkpoint's tensors as this rank holds them (Strategy::hold), or as it writes them.
struct CheckpointEntries {
  std::vector<checkpoint::Entry> model;      // the saved parameters: model.safetensors
  std::vector<checkpoint::Entry> optimizer;  // the optimizer's state: optimizer.safetensors
  std::vector<checkpoint::Entry> average;    // the weight average's ("ema/<parameter>"), after it
  // model.safetensors's metadata: the run's name and step.
  std::map<std::string, std::string> model_metadata;
};

// The run as it stands, for a checkpoint: its record (state.json), and the tensors this rank
// writes (checkpoint_entries), made a snapshot whose tensors are the live parameters and
// optimizer state, or their whole copies (the writer copies them when it writes later). In a run
// whose ranks each write a part (CheckpointWriting::parts), this rank's part: the entries it
// writes, each whole or as its range of elements (checkpoint::Entry), and, on rank 0, the text
// files.
checkpoint::TrainRecord train_record(const Run& run, double elapsed_seconds);
// What this rank writes of a checkpoint, as the run's strategies hold it (strategy.hpp's
// contract): under CheckpointWriting::whole, every rank takes part in making each entry whole
// (collective: every rank calls it at the same point) and rank 0 alone gets them; the others get
// none.
CheckpointEntries checkpoint_entries(const Run& run);
checkpoint::Snapshot live_snapshot(const Run& run, const checkpoint::TrainRecord& record, CheckpointEntries entries);

// The commit of a checkpoint whose parts the ranks write (docs/checkpoints.md#sharded-checkpoints):
// every rank's writer writes its part into the staging directory in the background; between
// steps the ranks agree (one small all-reduce, from the step loop's thread: the writer threads
// never communicate) whether every part is durable, and once all are, rank 0 commits the
// checkpoint with a manifest that lists every rank's files. Every method is collective: every
// rank calls it at the same point.
class PartsCommit {
 public:
  PartsCommit(World& world, checkpoint::CheckpointWriter* writer) : world_(world), writer_(writer) {}
  // A part was handed to the writer.
  void started() { pending_ = true; }
  bool pending() const { return pending_; }
  // Commits the pending checkpoint if every rank's part is written; with `wait`, once they are.
  // A rank whose part failed reports its error and every rank throws (World::together).
  void settle(bool wait);

 private:
  World& world_;
  checkpoint::CheckpointWriter* writer_;
  bool pending_ = false;
};

// The log line of a checkpoint moved aside because it failed verification.
std::string describe_set_aside(const checkpoint::SetAside& set_aside);

// "crc32c:<8 hex digits>" of a config.yaml's text.
std::string config_hash(const std::string& config_text);

// "1.49 GB", "12.3 MB", "830 kB".
std::string format_bytes(std::uint64_t bytes);

}  // namespace loom::training
