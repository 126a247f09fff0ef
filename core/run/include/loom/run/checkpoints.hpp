// `loom checkpoints RUN_DIR`: a run's checkpoints, each verified against its manifest.
#pragma once

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace loom {

struct CheckpointListing {
  std::int64_t step = 0;
  std::filesystem::path path;
  std::string saved_at;     // UTC, from its state.json (else the directory's modification time)
  std::uint64_t bytes = 0;  // of the files in it
  bool verifies = false;    // every file its manifest lists, with its size and CRC-32C
  std::string problem;      // what verification found, when it does not verify
  bool latest = false;      // what `latest` names: where trainer.resume=auto continues
  // The ranks that wrote it, from its manifest: "1 rank", "data 2 x fsdp 1"; "?" when the
  // manifest cannot be read.
  std::string mesh = "?";
};

struct CheckpointsReport {
  std::filesystem::path dir;                   // the checkpoint directory
  std::vector<CheckpointListing> checkpoints;  // by step
  std::vector<std::string> leftovers;          // interrupted writes and deletions (.tmp-step-*, .deleting-*)
  // Checkpoints loom moved aside because they failed verification (step-N.unusable-<time>), by
  // name: never resumed from nor deleted by loom.
  std::vector<std::string> set_aside;
};

// The checkpoints of a run directory (its trainer.checkpoint.dir, from its config.yaml, else
// RUN_DIR/checkpoints), or of a checkpoint directory given directly. UserError when there is
// none.
CheckpointsReport list_checkpoints(const std::filesystem::path& run_or_checkpoint_dir);

// The report as a table: step, time, size, whether it verifies (and why not).
void print_checkpoints(std::ostream& out, const CheckpointsReport& report);

}  // namespace loom
