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
#include "loom/tensor.hpp"

namespace loom::checkpoint {

// What a checkpoint holds: two tensor files and small text files, by name.
struct Snapshot {
  std::int64_t step = 0;
  std::vector<std::pair<std::string, Tensor>> model;      // -> model.safetensors
  std::vector<std::pair<std::string, Tensor>> optimizer;  // -> optimizer.safetensors
  std::map<std::string, std::string> model_metadata, optimizer_metadata;
  std::vector<std::pair<std::string, std::string>> files;  // state.json, config.yaml, tokenizer.state, ...
};

// Writes the snapshot's files into `dir`, each fsynced (the store's write_files step).
void write_snapshot(const Snapshot& snapshot, const std::filesystem::path& dir);

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
  CheckpointWriter(CheckpointStore store, bool async);
  // Finishes the write in flight (its error, if any, is dropped: there is no one to tell).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Saves `live`, whose tensors may be the live ones: waits for the previous write (rethrowing
  // its error), then either writes now (async off) or copies the tensors and hands the copy to
  // the background thread.
  void save(const Snapshot& live);
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
};

}  // namespace loom::checkpoint
