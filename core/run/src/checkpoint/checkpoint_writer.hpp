// Writing checkpoints beside the step loop. save() takes a snapshot (the step loop's only cost:
// a copy of the weights and the optimizer state into buffers the writer keeps from one
// checkpoint to the next) and returns; a background thread writes it by the store's protocol.
// With async off, save() writes before it returns.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/sharded_checkpoint.hpp"
#include "loom/tensor.hpp"

namespace loom::checkpoint {

// What a checkpoint holds: two groups of tensors and small text files, by name.
struct Snapshot {
  std::int64_t step = 0;
  std::vector<Entry> model;      // -> model.safetensors (or this rank's model.rank-... file)
  std::vector<Entry> optimizer;  // -> optimizer.safetensors (or optimizer.rank-...)
  std::map<std::string, std::string> model_metadata, optimizer_metadata;
  std::vector<std::pair<std::string, std::string>> files;  // state.json, config.yaml, tokenizer.state, ...
  MeshSizes mesh;                                          // the run's ranks, for the manifest (empty: one process)
  // 0: every tensor whole, written by one process (or rank 0 of ranks that hold replicas) into
  // model.safetensors and optimizer.safetensors. N: this is rank `rank`'s part of a checkpoint
  // that N ranks write, into its rank files (sharded_checkpoint.hpp); `files` only on rank 0.
  int shards = 0, rank = 0;
};

// Writes the snapshot's files into `dir`, each fsynced (the store's write_files step). Returns
// their names.
std::vector<std::string> write_snapshot(const Snapshot& snapshot, const std::filesystem::path& dir);

// How far this rank's part of a checkpoint that several ranks write has come.
enum class PartState {
  none,     // no part in hand
  writing,  // the background thread is writing it
  written,  // its files are durable in the staging directory: part() lists them
  failed,   // the write failed: wait() rethrows the error
};

// A finished write, for the log.
struct WriteReport {
  std::int64_t step = 0;
  std::filesystem::path path;
  std::uint64_t bytes = 0;
  double snapshot_seconds = 0;  // the copy in the step loop (0 when not async)
  double write_seconds = 0;     // the write and commit
  std::vector<std::int64_t> removed;
  std::vector<SetAside> set_aside;
};

class CheckpointWriter {
 public:
  // `staging_token`: for a run whose ranks each write a part, the same on every rank (rank 0's
  // pid): names the directory that they write their parts into (CheckpointStore::create_staging).
  CheckpointWriter(CheckpointStore store, bool async, std::string staging_token = "");
  // Finishes the write in flight (its error, if any, is dropped: there is no one to tell).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `live`, whose tensors may be the live ones: waits for the previous write (rethrowing
  // its error), then either writes now (async off) or copies the tensors and hands the copy to
  // the background thread. A part (live.shards > 0) is only written into the staging directory:
  // the checkpoint is committed by commit_parts() once every rank's part is written.
  void save(const Snapshot& live);

  // A rank's part, for the ranks' agreement (which the caller makes from the step loop's thread:
  // this class never communicates). Never blocks.
  PartState part_state();
  // Waits for the background thread, without rethrowing its error (part_state() then says failed).
  void wait_idle();
  // The files of the part written (part_state() == written), with their sizes and checksums.
  const std::vector<ManifestEntry>& part_files() const { return part_files_; }
  // Rank 0, once every rank's part is written: commits the checkpoint whose files `files` lists
  // (every rank's), in the background when async. The other ranks: drop_part().
  void commit_parts(std::vector<ManifestEntry> files);
  void drop_part();
  // Async: allocates the snapshot buffers for tensors shaped as `layout`'s on the background
  // thread and touches every page, so that the first save() only copies (a fresh allocation of
  // a large model's state would fault its pages in inside the step loop). Returns at once.
  void reserve(const Snapshot& layout);
  // Waits for the write in flight; rethrows its error.
  void wait();
  // Writes finished since the last call.
  std::vector<WriteReport> take_reports();

  const CheckpointStore& store() const { return store_; }

 private:
  void copy_into_buffers(const Snapshot& live);
  void write(const Snapshot& snapshot, double snapshot_seconds);
  void write_part(const Snapshot& snapshot, double snapshot_seconds);
  void start(std::function<void()> job);
  void run();

  CheckpointStore store_;
  bool async_;
  Snapshot buffer_;  // the copy the thread writes (async)
  std::mutex mutex_;
  std::condition_variable changed_;
  bool pending_ = false, stop_ = false;
  std::function<void()> job_;  // what the thread does next
  std::exception_ptr error_;
  std::vector<WriteReport> reports_;
  std::thread worker_;
  // The part in hand (a run whose ranks each write a part).
  std::string staging_token_;
  bool has_part_ = false;
  std::int64_t part_step_ = 0;
  int part_shards_ = 0;
  MeshSizes part_mesh_;
  std::filesystem::path part_dir_;
  std::vector<ManifestEntry> part_files_;
  double part_snapshot_seconds_ = 0, part_write_seconds_ = 0;
};

}  // namespace loom::checkpoint
