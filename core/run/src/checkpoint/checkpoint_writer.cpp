#include "checkpoint/checkpoint_writer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/durable_io.hpp"
#include "loom/error.hpp"
#include "loom/execution.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool same_layout(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.dtype() == b.dtype() && a.shape() == b.shape();
}

// dst <- src, in parallel pieces on the run's thread pool (the step loop is waiting anyway).
void copy_tensor(const Tensor& dst, const Tensor& src) {
  if (!src.is_contiguous() || !src.is_host_visible()) {
    dst.copy_from(src);
    return;
  }
  auto* to = static_cast<char*>(dst.raw_data());
  const auto* from = static_cast<const char*>(src.raw_data());
  const std::int64_t bytes = src.numel() * static_cast<std::int64_t>(dtype_size(src.dtype()));
  default_execution_context().parallel_for(bytes, std::int64_t{1} << 20, [&](std::int64_t begin, std::int64_t end) {
    std::memcpy(to + begin, from + begin, static_cast<std::size_t>(end - begin));
  });
}

// Makes `buffers` tensors of `live`'s names and layouts, keeping them when they are already (the
// buffers are kept across checkpoints: a fresh allocation would fault in every page again).
// Returns whether it allocated.
bool fit_buffers(std::vector<Entry>& buffers, const std::vector<Entry>& live) {
  bool reuse = buffers.size() == live.size();
  for (std::size_t i = 0; reuse && i < live.size(); ++i)
    reuse = buffers[i].name == live[i].name && same_layout(buffers[i].data, live[i].data) &&
            buffers[i].global_shape == live[i].global_shape && buffers[i].begin == live[i].begin &&
            buffers[i].end == live[i].end;
  if (reuse) return false;
  buffers.clear();
  for (const auto& e : live)
    buffers.emplace_back(e.name, Tensor::empty(e.data.shape(), e.data.dtype()), e.global_shape, e.begin, e.end);
  return true;
}

void copy_tensors(std::vector<Entry>& buffers, const std::vector<Entry>& live) {
  fit_buffers(buffers, live);
  for (std::size_t i = 0; i < live.size(); ++i) copy_tensor(buffers[i].data, live[i].data);
}

void touch(const std::vector<Entry>& buffers) {
  for (const auto& e : buffers)
    std::memset(e.data.raw_data(), 0, static_cast<std::size_t>(e.data.numel()) * dtype_size(e.data.dtype()));
}

// One process's files hold every entry whole, as they always have.
std::vector<std::pair<std::string, Tensor>> whole_tensors(const std::vector<Entry>& entries) {
  std::vector<std::pair<std::string, Tensor>> out;
  out.reserve(entries.size());
  for (const auto& e : entries) {
    if (!e.whole())
      throw InternalError("checkpoint entry '" + e.name +
                          "' is a slice, in a checkpoint that one process writes whole");
    out.emplace_back(e.name, e.data);
  }
  return out;
}

// The writer's thread yields the cores to the step's threads when both want them: it has the
// whole interval between checkpoints to write, the step has none to spare.
void lower_priority() {
  [[maybe_unused]] const int rc = ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
}

}  // namespace

std::vector<std::string> write_snapshot(const Snapshot& snapshot, const fs::path& dir) {
  std::vector<std::string> names;
  if (snapshot.shards == 0) {
    safetensors::save(dir / "model.safetensors", whole_tensors(snapshot.model), snapshot.model_metadata);
    safetensors::save(dir / "optimizer.safetensors", whole_tensors(snapshot.optimizer), snapshot.optimizer_metadata);
    names = {"model.safetensors", "optimizer.safetensors"};
  } else {
    names = {rank_file_name("model", snapshot.rank, snapshot.shards),
             rank_file_name("optimizer", snapshot.rank, snapshot.shards)};
    save_rank_file(dir / names[0], snapshot.model, snapshot.model_metadata);
    save_rank_file(dir / names[1], snapshot.optimizer, snapshot.optimizer_metadata);
  }
  for (const auto& [name, contents] : snapshot.files) {
    write_synced(dir / name, contents);
    names.push_back(name);
  }
  return names;
}

CheckpointWriter::CheckpointWriter(CheckpointStore store, bool async, std::string staging_token)
    : store_(std::move(store)), async_(async), staging_token_(std::move(staging_token)) {
  if (async_)
    worker_ = std::thread([this] {
      lower_priority();
      run();
    });
}

CheckpointWriter::~CheckpointWriter() {
  if (!async_) return;
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return !pending_; });
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void CheckpointWriter::save(const Snapshot& live) {
  if (live.shards > 0 && has_part_)
    throw InternalError("checkpoint writer: a part is saved before the previous one was committed");
  if (!async_) {
    if (live.shards == 0) {
      write(live, 0);
      return;
    }
    // A part's failure is the ranks' to agree on (part_state), as it is when the thread writes.
    has_part_ = true;
    try {
      write_part(live, 0);
    } catch (...) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
    }
    return;
  }
  wait();
  const auto t0 = Clock::now();
  copy_into_buffers(live);
  const double snapshot_seconds = seconds_since(t0);
  if (live.shards > 0) {
    has_part_ = true;  // in the writing
    start([this, snapshot_seconds] { write_part(buffer_, snapshot_seconds); });
  } else {
    start([this, snapshot_seconds] { write(buffer_, snapshot_seconds); });
  }
}

void CheckpointWriter::write_part(const Snapshot& snapshot, double snapshot_seconds) {
  const auto t0 = Clock::now();
  with_context("while writing rank " + std::to_string(snapshot.rank) + "'s part of checkpoint " +
                   CheckpointStore::dir_name(snapshot.step) + " into " + store_.dir().string(),
               [&] {
                 std::error_code ec;
                 fs::create_directories(store_.dir(), ec);
                 const fs::path dir = store_.create_staging(snapshot.step, staging_token_);
                 store_.reached(CommitStage::temp_created, snapshot.step);
                 const std::vector<std::string> names = write_snapshot(snapshot, dir);
                 sync_path(dir);  // the files' names (safetensors::save renames into place)
                 std::vector<ManifestEntry> files;
                 for (const auto& name : names) {
                   const FileChecksum sum = checksum_file(dir / name);
                   files.push_back({name, sum.size, sum.crc32c});
                 }
                 std::lock_guard lock(mutex_);
                 has_part_ = true;
                 part_step_ = snapshot.step;
                 part_shards_ = snapshot.shards;
                 part_mesh_ = snapshot.mesh;
                 part_dir_ = dir;
                 part_files_ = std::move(files);
                 part_snapshot_seconds_ = snapshot_seconds;
                 part_write_seconds_ = seconds_since(t0);
               });
  store_.reached(CommitStage::files_written, snapshot.step);
}

PartState CheckpointWriter::part_state() {
  std::lock_guard lock(mutex_);
  if (pending_) return PartState::writing;
  if (error_) return PartState::failed;
  return has_part_ && !part_dir_.empty() ? PartState::written : PartState::none;
}

void CheckpointWriter::wait_idle() {
  if (!async_) return;
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pending_; });
}

void CheckpointWriter::drop_part() {
  std::lock_guard lock(mutex_);
  has_part_ = false;
  part_dir_.clear();
  part_files_.clear();
}

void CheckpointWriter::commit_parts(std::vector<ManifestEntry> files) {
  Manifest manifest;
  manifest.step = part_step_;
  manifest.files = std::move(files);
  std::sort(manifest.files.begin(), manifest.files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  manifest.mesh = part_mesh_;
  manifest.shards = part_shards_;
  const fs::path dir = part_dir_;
  const double snapshot_seconds = part_snapshot_seconds_, write_seconds = part_write_seconds_;
  drop_part();
  auto job = [this, manifest = std::move(manifest), dir, snapshot_seconds, write_seconds] {
    const auto t0 = Clock::now();
    const CommitResult commit = with_context(
        "while committing checkpoint " + CheckpointStore::dir_name(manifest.step) + " into " + store_.dir().string(),
        [&] { return store_.commit_staged(dir, manifest); });
    WriteReport report{
        manifest.step,  commit.path,     commit.bytes, snapshot_seconds, write_seconds + seconds_since(t0),
        commit.removed, commit.set_aside};
    std::lock_guard lock(mutex_);
    reports_.push_back(std::move(report));
  };
  if (!async_) {
    job();
    return;
  }
  wait();
  start(std::move(job));
}

void CheckpointWriter::reserve(const Snapshot& layout) {
  if (!async_) return;
  wait();
  std::vector<Entry> model = layout.model, optimizer = layout.optimizer;  // names and layouts only
  start([this, model = std::move(model), optimizer = std::move(optimizer)] {
    if (fit_buffers(buffer_.model, model)) touch(buffer_.model);
    if (fit_buffers(buffer_.optimizer, optimizer)) touch(buffer_.optimizer);
  });
}

void CheckpointWriter::start(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    job_ = std::move(job);
    pending_ = true;
  }
  changed_.notify_all();
}

void CheckpointWriter::copy_into_buffers(const Snapshot& live) {
  buffer_.step = live.step;
  copy_tensors(buffer_.model, live.model);
  copy_tensors(buffer_.optimizer, live.optimizer);
  buffer_.model_metadata = live.model_metadata;
  buffer_.optimizer_metadata = live.optimizer_metadata;
  buffer_.files = live.files;
  buffer_.mesh = live.mesh;
  buffer_.shards = live.shards;
  buffer_.rank = live.rank;
}

void CheckpointWriter::wait() {
  if (!async_) {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return;
  }
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !pending_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::vector<WriteReport> CheckpointWriter::take_reports() {
  std::lock_guard lock(mutex_);
  return std::exchange(reports_, {});
}

void CheckpointWriter::write(const Snapshot& snapshot, double snapshot_seconds) {
  const auto t0 = Clock::now();
  const CommitResult commit = with_context(
      "while writing checkpoint " + CheckpointStore::dir_name(snapshot.step) + " into " + store_.dir().string(), [&] {
        return store_.commit(
            snapshot.step, [&](const fs::path& dir) { write_snapshot(snapshot, dir); }, snapshot.mesh);
      });
  WriteReport report{snapshot.step,     commit.path,    commit.bytes,    snapshot_seconds,
                     seconds_since(t0), commit.removed, commit.set_aside};
  std::lock_guard lock(mutex_);
  reports_.push_back(std::move(report));
}

void CheckpointWriter::run() {
  while (true) {
    std::function<void()> job;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stop_ || pending_; });
      if (!pending_) return;
      job = std::move(job_);
    }
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard lock(mutex_);
      pending_ = false;
      error_ = error;
    }
    changed_.notify_all();
  }
}

}  // namespace loom::checkpoint
