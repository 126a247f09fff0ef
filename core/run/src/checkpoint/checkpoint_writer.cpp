#include "checkpoint/checkpoint_writer.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

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
bool fit_buffers(std::vector<std::pair<std::string, Tensor>>& buffers,
                 const std::vector<std::pair<std::string, Tensor>>& live) {
  bool reuse = buffers.size() == live.size();
  for (std::size_t i = 0; reuse && i < live.size(); ++i)
    reuse = buffers[i].first == live[i].first && same_layout(buffers[i].second, live[i].second);
  if (reuse) return false;
  buffers.clear();
  for (const auto& [name, t] : live) buffers.emplace_back(name, Tensor::empty(t.shape(), t.dtype()));
  return true;
}

void copy_tensors(std::vector<std::pair<std::string, Tensor>>& buffers,
                  const std::vector<std::pair<std::string, Tensor>>& live) {
  fit_buffers(buffers, live);
  for (std::size_t i = 0; i < live.size(); ++i) copy_tensor(buffers[i].second, live[i].second);
}

void touch(const std::vector<std::pair<std::string, Tensor>>& buffers) {
  for (const auto& [name, t] : buffers)
    std::memset(t.raw_data(), 0, static_cast<std::size_t>(t.numel()) * dtype_size(t.dtype()));
}

// The writer's thread yields the cores to the step's threads when both want them: it has the
// whole interval between checkpoints to write, the step has none to spare.
void lower_priority() {
  [[maybe_unused]] const int rc = ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
}

}  // namespace

void write_snapshot(const Snapshot& snapshot, const fs::path& dir) {
  safetensors::save(dir / "model.safetensors", snapshot.model, snapshot.model_metadata);
  safetensors::save(dir / "optimizer.safetensors", snapshot.optimizer, snapshot.optimizer_metadata);
  for (const auto& [name, contents] : snapshot.files) write_synced(dir / name, contents);
}

CheckpointWriter::CheckpointWriter(CheckpointStore store, bool async) : store_(std::move(store)), async_(async) {
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
  if (!async_) {
    write(live, 0);
    return;
  }
  wait();
  const auto t0 = Clock::now();
  copy_into_buffers(live);
  const double snapshot_seconds = seconds_since(t0);
  start([this, snapshot_seconds] { write(buffer_, snapshot_seconds); });
}

void CheckpointWriter::reserve(const Snapshot& layout) {
  if (!async_) return;
  wait();
  std::vector<std::pair<std::string, Tensor>> model, optimizer;  // names and layouts only
  for (const auto& [name, t] : layout.model) model.emplace_back(name, t);
  for (const auto& [name, t] : layout.optimizer) optimizer.emplace_back(name, t);
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
}

void CheckpointWriter::wait() {
  if (!async_) return;
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
      "while writing checkpoint " + CheckpointStore::dir_name(snapshot.step) + " into " + store_.dir().string(),
      [&] { return store_.commit(snapshot.step, [&](const fs::path& dir) { write_snapshot(snapshot, dir); }); });
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
