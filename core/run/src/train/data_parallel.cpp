#include "train/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <string>

#include "loom/error.hpp"

namespace loom::training {

namespace {

// A staged bucket's all-reduce: the sum arrives in the host copy, which goes back to the device
// when it is waited for.
class StagedPending final : public CollectiveGroup::Pending {
 public:
  StagedPending(std::unique_ptr<CollectiveGroup::Pending> inner, Tensor device, Tensor host)
      : inner_(std::move(inner)), device_(std::move(device)), host_(std::move(host)) {}
  void wait() override {
    inner_->wait();
    device_.copy_from(host_);
  }

 private:
  std::unique_ptr<CollectiveGroup::Pending> inner_;
  Tensor device_, host_;
};

}  // namespace

DataParallel::DataParallel(World& world)
    : world_(world), data_group_(world.data_group()), rank_(world.rank()), size_(world.size()) {
  if (!data_group_) throw InternalError("DataParallel: the world's mesh is not set");
}

void DataParallel::attach(const std::vector<ModelParameter>& parameters, std::int64_t bucket_bytes) {
  if (size_ == 1) return;
  for (const auto& p : parameters)
    if (p.parameter->requires_grad()) {
      decide_staging(p.parameter->tensor().device(), replicated_group());
      break;
    }
  // Backward produces the last layers' gradients first: buckets in reverse parameter order.
  std::int64_t filled = 0;
  std::vector<std::pair<Parameter*, std::int64_t>> pending;
  auto close = [&] {
    if (pending.empty()) return;
    Bucket b;
    b.storage = Tensor::zeros(Shape{filled}, DType::f32, pending.front().first->tensor().device());
    if (staged_) b.host = Tensor::zeros(Shape{filled});
    for (auto& [p, offset] : pending) {
      p->set_grad_buffer(b.storage.slice(0, offset, offset + p->tensor().numel()).view(p->shape()));
      b.parameters.emplace_back(p, offset);
      bucket_of_[p] = buckets_.size();
    }
    buckets_.push_back(std::move(b));
    pending.clear();
    filled = 0;
  };
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    Parameter* p = it->parameter;
    if (!p->requires_grad()) continue;
    const std::int64_t n = p->tensor().numel();
    if (filled > 0 && (filled + n) * 4 > bucket_bytes) close();
    pending.emplace_back(p, filled);
    filled += n;
    parameters_.push_back(p);
  }
  close();
  has_grad_.assign(parameters_.size(), 0.0f);
}

void DataParallel::shard(const std::vector<ModelParameter>& parameters) {
  if (size_ == 1) return;
  sharded_ = true;
  std::int64_t total = 0;
  for (const auto& p : parameters)
    if (p.parameter->requires_grad()) total += p.parameter->tensor().numel();
  // Contiguous shards in parameter order: a parameter goes to the rank whose share of the total
  // its first element falls in.
  std::vector<std::int64_t> filled(static_cast<std::size_t>(size_), 0);
  std::vector<std::pair<Parameter*, int>> assignment;
  std::int64_t start = 0;
  for (const auto& mp : parameters) {
    Parameter* p = mp.parameter;
    if (!p->requires_grad()) continue;
    const int rank =
        static_cast<int>(std::min<std::int64_t>(size_ - 1, start * size_ / std::max<std::int64_t>(1, total)));
    assignment.emplace_back(p, rank);
    filled[static_cast<std::size_t>(rank)] += p->tensor().numel();
    start += p->tensor().numel();
  }
  segment_ = *std::max_element(filled.begin(), filled.end());
  flat_grads_ = Tensor::zeros(Shape{segment_ * size_}, DType::f32, assignment.front().first->tensor().device());
  decide_staging(flat_grads_.device(), *data_group_);
  if (staged_) host_flat_ = Tensor::zeros(Shape{segment_ * size_});
  std::fill(filled.begin(), filled.end(), 0);
  for (auto& [p, rank] : assignment) {
    const std::int64_t offset = segment_ * rank + filled[static_cast<std::size_t>(rank)];
    filled[static_cast<std::size_t>(rank)] += p->tensor().numel();
    p->set_grad_buffer(flat_grads_.slice(0, offset, offset + p->tensor().numel()).view(p->shape()));
    layout_.emplace_back(p, offset, rank);
    parameters_.push_back(p);
    if (rank == rank_) owned_.insert(p);
    owner_[p] = rank;
  }
  has_grad_.assign(parameters_.size(), 0.0f);
}

void DataParallel::reduce_scatter_gradients() {
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    auto& [p, offset, rank] = layout_[i];
    has_grad_[i] = p->has_grad() ? 1.0f : 0.0f;
    if (!p->has_grad()) zero(flat_grads_, offset, p->tensor().numel());
  }
  // Staged: the whole buffer to the host, and this rank's summed segment back.
  if (staged_) host_flat_.copy_from(flat_grads_);
  float* flat = (staged_ ? host_flat_ : flat_grads_).data<float>();
  data_group_->all_reduce(std::span<float>(has_grad_), ReduceOp::max);
  // In place: this rank's segment of the buffer receives its sums. No buffer of the gradients'
  // size besides theirs, so the run's memory falls by the optimizer state the shard saves.
  const std::size_t segment = static_cast<std::size_t>(segment_);
  data_group_->reduce_scatter(std::span<const float>(flat, segment * static_cast<std::size_t>(size_)),
                              std::span<float>(flat + segment * static_cast<std::size_t>(rank_), segment));
  if (staged_) {
    const std::int64_t begin = segment_ * rank_;
    flat_grads_.slice(0, begin, begin + segment_).copy_from(host_flat_.slice(0, begin, begin + segment_));
  }
  // This rank's shard holds the sums; the rest of the buffer is not a gradient of anything.
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    auto& [p, offset, rank] = layout_[i];
    if (rank == rank_ && has_grad_[i] != 0.0f)
      p->mark_grad_written();
    else
      p->zero_grad();
  }
}

void DataParallel::gather_parameters() {
  if (!sharded_) return;
  const auto start = std::chrono::steady_clock::now();
  // The gradient buffer carries the weights: the step is done with the gradients, and this rank's
  // updated shard goes into its segment, every rank's to every rank, in place.
  // (Tensor copies: memcpy on the host, the device's own copy on a device.) Staged, the buffer
  // goes to the host after this rank's weights are in, and comes back with every rank's.
  const std::size_t segment = static_cast<std::size_t>(segment_);
  for (auto& [p, offset, rank] : layout_) {
    if (rank != rank_) continue;
    const Tensor v = p->data();
    flat_grads_.slice(0, offset, offset + v.numel()).view(v.shape()).copy_from(v);
    p->zero_grad();  // its storage holds weights now
  }
  if (staged_) host_flat_.copy_from(flat_grads_);
  float* flat = (staged_ ? host_flat_ : flat_grads_).data<float>();
  data_group_->all_gather(std::span<const float>(flat + segment * static_cast<std::size_t>(rank_), segment),
                          std::span<float>(flat, segment * static_cast<std::size_t>(size_)));
  if (staged_) flat_grads_.copy_from(host_flat_);
  for (auto& [p, offset, rank] : layout_) {
    if (rank == rank_) continue;
    const Tensor v = p->data();
    v.copy_from(flat_grads_.slice(0, offset, offset + v.numel()).view(v.shape()));
  }
  communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void DataParallel::zero(const Tensor& buffer, std::int64_t offset, std::int64_t n) {
  if (buffer.is_host_visible()) {
    std::memset(buffer.data<float>() + offset, 0, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  if (!backend_) throw InternalError("DataParallel: gradient buckets in device memory, but no backend to zero them");
  backend_->fill(buffer.device_data<float>() + offset, 0.0f, n);
}

void DataParallel::gradient_ready(Parameter& p) {
  if (size_ == 1 || sharded_) return;
  const auto it = bucket_of_.find(&p);
  if (it == bucket_of_.end()) return;
  ++buckets_[it->second].ready;
  start_ready_buckets();
}

void DataParallel::start_ready_buckets() {
  while (started_ < buckets_.size() && buckets_[started_].ready >= buckets_[started_].parameters.size()) {
    Bucket& b = buckets_[started_++];
    // A parameter that no micro-batch of this rank reached contributes zeros.
    for (auto& [p, offset] : b.parameters)
      if (!p->has_grad()) zero(b.storage, offset, p->tensor().numel());
    if (staged_) {
      b.host.copy_from(b.storage);
      pending_.push_back(
          std::make_unique<StagedPending>(replicated_group().start_all_reduce(std::span<float>(
                                              b.host.data<float>(), static_cast<std::size_t>(b.host.numel()))),
                                          b.storage, b.host));
    } else {
      pending_.push_back(replicated_group().start_all_reduce(
          std::span<float>(b.storage.data<float>(), static_cast<std::size_t>(b.storage.numel()))));
    }
  }
}

void DataParallel::decide_staging(const Device& device, const CollectiveGroup& group) {
  staged_ = !group.can_send_from(buffer_type_of(device));
}

std::string DataParallel::staging_note() const {
  if (!staged_) return "";
  const std::string device = (sharded_ ? flat_grads_ : buckets_.front().storage).device().str();
  return "note: the collective (" + world_.collective().describe() + ") cannot send from " + device +
         " memory: the gradients are staged through host memory (" +
         (sharded_ ? std::string("two copies for the reduce-scatter and two for the gather each step")
                   : "two copies per bucket and step, " + std::to_string(buckets_.size()) + " bucket" +
                         (buckets_.size() == 1 ? "" : "s")) +
         "); a collective that reads the device's memory itself (CUDA-aware MPI, NCCL) says so by "
         "CollectiveGroup::can_send_from";
}

void DataParallel::start_remaining_buckets() {
  if (size_ == 1 || sharded_) return;
  for (auto& b : buckets_) b.ready = b.parameters.size();
  start_ready_buckets();
}

void DataParallel::reduce_gradients() {
  if (size_ == 1) return;
  const auto start = std::chrono::steady_clock::now();
  if (sharded_) {
    reduce_scatter_gradients();
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  // Buckets not started yet (start_remaining_buckets() was not called) start now, in order.
  start_remaining_buckets();
  // Which parameters any rank's micro-batches reached: those get the sum; the others stay
  // without a gradient, as on one process.
  for (std::size_t i = 0; i < parameters_.size(); ++i) has_grad_[i] = parameters_[i]->has_grad() ? 1.0f : 0.0f;
  replicated_group().all_reduce(std::span<float>(has_grad_), ReduceOp::max);
  for (auto& p : pending_) p->wait();
  pending_.clear();
  for (auto& b : buckets_) b.ready = 0;
  started_ = 0;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (has_grad_[i] != 0.0f) parameters_[i]->mark_grad_written();
  communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double DataParallel::take_communication_seconds() {
  const double s = communication_seconds_;
  communication_seconds_ = 0;
  return s;
}

}  // namespace loom::training
