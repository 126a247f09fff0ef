// A directory of checkpoints and the protocol that commits one atomically.
//
//   <dir>/step-<N>/        a committed checkpoint (manifest.json lists its files)
//   <dir>/latest           "step-<N>\n": the checkpoint a resumed run continues from
//   <dir>/.tmp-step-<N>-<pid>/, .deleting-step-<N>-<pid>/
//                          a write or a deletion that a crash interrupted (removed by the next run)
//   <dir>/step-<N>.unusable-<time>/
//                          a checkpoint that failed verification, moved aside: loom never deletes
//                          one (it may be repaired, or hold what a bug in loom would destroy)
//
// commit(N) writes checkpoint N in these stages, each durable before the next starts:
//   1. the temporary directory .tmp-step-<N>-<pid>/ is created;
//   2. the caller writes the files into it, each fsynced;
//   3. manifest.json (size and CRC-32C of every file) is written and fsynced, then the directory;
//   4. the directory is renamed to step-<N>, and <dir> is fsynced;
//   5. `latest` is replaced atomically (a fsynced temporary renamed over it, <dir> fsynced);
//   6. retention: checkpoints that the policy no longer keeps are renamed away and removed.
// A crash at any instant leaves `latest` naming either the previous checkpoint or the new one,
// each complete; nothing is deleted before the new checkpoint is committed (stage 5).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/manifest.hpp"

namespace loom::checkpoint {

// Which checkpoints stay once a new one is committed: the newest, the `keep_last` newest of
// the rolling ones that verify, and every permanent one (a step that is a multiple of
// keep_every_steps). A checkpoint that fails verification does not count and is moved aside,
// never deleted.
struct Retention {
  std::int64_t keep_last = 2;         // >= 1
  std::int64_t keep_every_steps = 0;  // 0: no permanent checkpoints
  bool is_permanent(std::int64_t step) const { return keep_every_steps > 0 && step % keep_every_steps == 0; }
};

enum class CommitStage {
  temp_created,      // 1
  files_written,     // 2
  manifest_written,  // 3
  renamed,           // 4
  latest_replaced,   // 5
  retention_done,    // 6
};
const char* stage_name(CommitStage stage);

struct CheckpointDir {
  std::int64_t step = 0;
  std::filesystem::path path;
};

// A checkpoint that failed verification, moved aside.
struct SetAside {
  std::int64_t step = 0;
  std::filesystem::path from, to;  // step-<N>/ and step-<N>.unusable-<time>/
  std::string problem;             // what failed: Verification::describe
};

struct CommitResult {
  std::filesystem::path path;
  std::uint64_t bytes = 0;            // the files' total size
  std::vector<std::int64_t> removed;  // steps deleted by the retention policy
  std::vector<SetAside> set_aside;    // older checkpoints that no longer verify
};

// What discard_after did.
struct Discarded {
  std::vector<std::int64_t> removed;  // verified checkpoints deleted
  std::vector<SetAside> set_aside;    // ones that failed verification, moved aside
};

// The latest valid checkpoint, and what was wrong with the newer ones passed over.
struct LatestValid {
  std::optional<CheckpointDir> checkpoint;
  std::vector<std::string> warnings;  // one per corrupt or incomplete checkpoint, naming it
};

class CheckpointStore {
 public:
  explicit CheckpointStore(std::filesystem::path dir, Retention retention = {});

  const std::filesystem::path& dir() const { return dir_; }
  const Retention& retention() const { return retention_; }

  // "step-<N>", and back (nullopt for any other name).
  static std::string dir_name(std::int64_t step);
  static std::optional<std::int64_t> parse_dir_name(const std::string& name);

  // Every step-<N> directory, by step (committed or not: verify_checkpoint tells).
  std::vector<CheckpointDir> list() const;
  // The checkpoints moved aside (step-<N>.unusable-<time>/), by name.
  std::vector<std::filesystem::path> list_set_aside() const;
  // Whether `name` is one of those.
  static bool is_set_aside_name(const std::string& name);
  // Whether step-<N> verifies (verify_checkpoint, and its manifest is for step N), with the
  // problem when it does not. Reads every byte.
  bool verifies(const CheckpointDir& checkpoint, std::string* problem = nullptr) const;
  // Renames step-<N> to step-<N>.unusable-<time> (a free name) and syncs the directory. Throws
  // UserError when it cannot.
  SetAside set_aside(const CheckpointDir& checkpoint, std::string problem) const;
  // The step `latest` names; nullopt when there is no pointer or it names nothing valid.
  std::optional<std::int64_t> latest() const;

  // The checkpoint a run resumes from under trainer.resume=auto: `latest`'s (or, without a
  // pointer, the newest step directory), verified; when it fails, the next older one that
  // verifies, with a warning for each passed over.
  LatestValid find_latest_valid() const;

  // Writes checkpoint `step` by the protocol above: `write_files(temp_dir)` writes the files
  // (each fsynced). Throws UserError when something cannot be written; the temporary directory
  // is removed then and `latest` is unchanged.
  // `mesh`: the ranks of the run, recorded in the manifest (empty: one process).
  CommitResult commit(std::int64_t step, const std::function<void(const std::filesystem::path&)>& write_files,
                      const MeshSizes& mesh = {});

  // A checkpoint whose files several ranks write (sharded_checkpoint.hpp) is committed in two
  // halves: every rank writes and fsyncs its files into one staging directory (stages 1 and 2,
  // in parallel), and once all of them are durable (the ranks agree by a collective of their own),
  // rank 0 alone runs stages 3 to 6 with commit_staged(). A crash of any rank before rank 0's
  // rename leaves only the staging directory, which the next run removes.
  //
  // .tmp-step-<N>-<token>/, created if it is not there yet: `token` must be the same on every
  // rank of the run and differ between runs (rank 0's pid).
  std::filesystem::path create_staging(std::int64_t step, const std::string& token) const;
  // Rank 0, once every rank's files are durable in `staging`: checks that every file `manifest`
  // lists is there with its size (a rank whose checkpoint directory is not rank 0's, such as a
  // node-local disk, is an error saying so), then writes the manifest, renames, replaces
  // `latest` and applies retention.
  CommitResult commit_staged(const std::filesystem::path& staging, const Manifest& manifest);

  // For the crash tests of a run of several ranks: this store's rank (LOOM_TEST_CHECKPOINT_KILL).
  void set_rank(int rank) { rank_ = rank; }
  // Calls the stage hook (and the test hook): stage `s` of checkpoint `step` is done.
  void reached(CommitStage s, std::int64_t step) const;

  // Removes what interrupted writes and deletions left (.tmp-step-*, .deleting-*, a temporary
  // `latest`). Only safe while no other process writes into the directory.
  void remove_leftovers() const;
  // Removes the step directories past `step` (a run that resumes from `step`, or starts afresh
  // at 0, replaces them), and `latest` when it names one of them; those that fail verification
  // are moved aside instead.
  Discarded discard_after(std::int64_t step) const;

  // For crash tests: called after each stage of commit() (it may kill the process).
  void set_stage_hook(std::function<void(CommitStage)> hook) { stage_hook_ = std::move(hook); }

 private:
  CommitResult finish_commit(const std::filesystem::path& temp, const Manifest& manifest);
  void apply_retention(std::int64_t newest, CommitResult& result) const;
  void remove_directory(const std::filesystem::path& path) const;

  std::filesystem::path dir_;
  Retention retention_;
  std::function<void(CommitStage)> stage_hook_;
  int rank_ = 0;
  // Steps known to verify: committed by this store, or verified since. Retention trusts them
  // rather than read every kept checkpoint again at every commit.
  mutable std::set<std::int64_t> verified_;
};

}  // namespace loom::checkpoint
