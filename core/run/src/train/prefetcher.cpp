#include "train/prefetcher.hpp"

#include "loom/error.hpp"

namespace loom::training {

Prefetcher::~Prefetcher() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

void Prefetcher::take(std::int64_t index, Batch& out) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return !ready_.empty() || error_; });
  if (ready_.empty() && error_) std::rethrow_exception(error_);
  if (ready_.front().first != index) throw InternalError("prefetcher out of order");
  std::swap(out, ready_.front().second);
  spare_.push_back(std::move(ready_.front().second));
  ready_.pop_front();
  changed_.notify_all();
}

void Prefetcher::run() {
  try {
    while (true) {
      Batch batch;
      std::int64_t index;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || (ready_.size() < depth_ && next_ < last_); });
        if (stop_) return;
        index = next_++;
        if (!spare_.empty()) {
          batch = std::move(spare_.back());
          spare_.pop_back();
        }
      }
      dataset_.batch(Split::train, index, batch);
      {
        std::lock_guard lock(mutex_);
        ready_.emplace_back(index, std::move(batch));
      }
      changed_.notify_all();
    }
  } catch (...) {
    std::lock_guard lock(mutex_);
    error_ = std::current_exception();
    changed_.notify_all();
  }
}

}  // namespace loom::training
