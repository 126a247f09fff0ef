// Training batches prepared ahead on one thread, so the step never waits on data.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "loom/kinds/dataset.hpp"

namespace loom::training {

// Batches first .. last - 1 of the training split, prepared `depth` steps ahead (the dataset's
// batch() is const and deterministic in its index, so preparing it early changes nothing).
class Prefetcher {
 public:
  Prefetcher(const Dataset& dataset, std::int64_t first, std::int64_t last, std::size_t depth)
      : dataset_(dataset), next_(first), last_(last), depth_(depth), worker_([this] { run(); }) {}
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The batch of `index` (indices are taken in order). Rethrows what the dataset threw.
  void take(std::int64_t index, Batch& out);

 private:
  void run();

  const Dataset& dataset_;
  std::int64_t next_, last_;
  std::size_t depth_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::pair<std::int64_t, Batch>> ready_;
  std::vector<Batch> spare_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace loom::training
