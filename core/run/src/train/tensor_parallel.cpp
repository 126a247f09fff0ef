#include "train/tensor_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iomanip>
#include <set>
#include <sstream>
#include <utility>

#include "loom/error.hpp"

namespace loom::training {

namespace {

// "exp_avg/h.0.attn.c_attn.weight" -> "h.0.attn.c_attn.weight"; a parameter's name unchanged.
std::string parameter_of(const std::string& entry) {
  const auto slash = entry.rfind('/');
  return slash == std::string::npos ? entry : entry.substr(slash + 1);
}

// A group that counts the payload of the operations' collectives and passes them on.
class CountingGroup final : public CollectiveGroup {
 public:
  // Times each operation too (waiting included: the time the step spends in the group's
  // collectives).
  template <class F>
  void timed(std::size_t n, F&& f) {
    const auto start = std::chrono::steady_clock::now();
    count(n);
    f();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  explicit CountingGroup(std::shared_ptr<CollectiveGroup> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  void all_reduce(std::span<float> data, ReduceOp op) override {
    timed(data.size_bytes(), [&] { inner_->all_reduce(data, op); });
  }
  void all_reduce(std::span<double> data, ReduceOp op) override {
    timed(data.size_bytes(), [&] { inner_->all_reduce(data, op); });
  }
  void reduce_scatter(std::span<const float> in, std::span<float> out) override {
    timed(in.size_bytes(), [&] { inner_->reduce_scatter(in, out); });
  }
  void all_gather(std::span<const float> in, std::span<float> out) override {
    timed(out.size_bytes(), [&] { inner_->all_gather(in, out); });
  }
  void broadcast(std::span<std::byte> data, int root) override { inner_->broadcast(data, root); }
  bool can_send_from(const BufferType& type) const override { return inner_->can_send_from(type); }
  void barrier() override { inner_->barrier(); }
  std::unique_ptr<Pending> start_all_reduce(std::span<float> data) override {
    count(data.size_bytes());
    return inner_->start_all_reduce(data);
  }
  std::int64_t bytes = 0, calls = 0;
  double seconds = 0;

 private:
  void count(std::size_t n) {
    bytes += static_cast<std::int64_t>(n);
    ++calls;
  }
  std::shared_ptr<CollectiveGroup> inner_;
};

}  // namespace

std::int64_t TensorParallel::take_bytes_moved() {
  auto& g = static_cast<CountingGroup&>(*counted_);
  return std::exchange(g.bytes, 0);
}
double TensorParallel::take_communication_seconds() {
  auto& g = static_cast<CountingGroup&>(*counted_);
  return std::exchange(g.seconds, 0.0);
}
std::int64_t TensorParallel::take_collectives() {
  auto& g = static_cast<CountingGroup&>(*counted_);
  return std::exchange(g.calls, 0);
}

TensorParallel::TensorParallel(std::shared_ptr<CollectiveGroup> group, Model& model, std::string model_name)
    : group_(std::move(group)), counted_(std::make_shared<CountingGroup>(group_)), model_name_(std::move(model_name)) {
  auto plan = model.parallel_plan();
  if (!plan)
    throw UserError("trainer.mesh.tensor is " + std::to_string(group_->size()) + " but the model (" + model_name_ +
                    ") declares no parallel plan (Model::parallel_plan): it cannot be split along the tensor axis; "
                    "use trainer.mesh.tensor: 1, or a model that declares one (gpt2, llama, gemma)");
  plan_ = std::move(*plan);
  const auto params = model.parameters();
  for (std::size_t i = 0; i < plan_.size(); ++i) {
    index_[plan_[i].parameter] = i;
    by_name_[plan_[i].parameter->name()] = i;
  }
  for (const auto& p : params)
    if (!index_.contains(p.parameter))
      throw InternalError("model (" + model_name_ + "): parallel_plan() leaves out parameter '" + p.parameter->name() +
                          "'");
  for (const auto& e : plan_) {
    const Shape expect = tensor_plan::shard_shape(e.whole, e.placement, rank(), size());
    if (!(expect == e.parameter->shape()))
      throw InternalError("model (" + model_name_ + "): parameter '" + e.parameter->name() + "' is " +
                          e.parameter->shape().str() + " on tensor rank " + std::to_string(rank()) +
                          ", its plan says " + expect.str() + " of " + e.whole.str());
  }
}

const PlannedParameter* TensorParallel::planned(const Parameter* p) const {
  const auto it = index_.find(p);
  return it == index_.end() ? nullptr : &plan_[it->second];
}

void TensorParallel::alias(const Parameter* piece, const Parameter* model) {
  const auto it = index_.find(model);
  if (it == index_.end()) throw InternalError("tensor parallel: an alias of '" + model->name() + "', outside the plan");
  index_[piece] = it->second;
}

const PlannedParameter* TensorParallel::planned(const std::string& entry) const {
  const auto it = by_name_.find(parameter_of(entry));
  return it == by_name_.end() ? nullptr : &plan_[it->second];
}

void TensorParallel::reduce_partial_gradients(const std::vector<ModelParameter>& trained) {
  for (const auto& mp : trained) {
    const PlannedParameter* e = planned(mp.parameter);
    if (!e || e->placement.split != TensorSplit::replicated_partial) continue;
    // Every member reached it or none did (they run the same graph).
    if (!mp.parameter->has_grad()) continue;
    const Tensor g = mp.parameter->grad();
    group_->all_reduce(std::span<float>(g.data<float>(), static_cast<std::size_t>(g.numel())));
  }
}

void TensorParallel::agree_on_gradients(const std::vector<ModelParameter>& trained) {
  std::vector<float> reached;
  for (const auto& mp : trained)
    if (is_split(mp.parameter)) reached.push_back(mp.parameter->has_grad() ? 1.0f : 0.0f);
  group_->all_reduce(std::span<float>(reached), ReduceOp::max);
  std::size_t i = 0;
  for (const auto& mp : trained)
    if (is_split(mp.parameter) && reached[i++] != 0.0f && !mp.parameter->has_grad()) mp.parameter->mark_grad_written();
}

double TensorParallel::sum_over_members(double value) const {
  group_->all_reduce(std::span<double>(&value, 1));
  return value;
}

Shape TensorParallel::whole_shape(const std::string& entry, const Shape& live) const {
  const PlannedParameter* e = planned(entry);
  if (!e || !e->placement.is_split() || !(live == e->parameter->shape())) return live;
  return e->whole;
}

Tensor TensorParallel::whole(const std::string& entry, const Tensor& live) const {
  const PlannedParameter* e = planned(entry);
  if (!e || !e->placement.is_split() || !(live.shape() == e->parameter->shape()) || held_whole(entry)) return live;
  Tensor out = Tensor::empty(e->whole);
  gather_into(*e, live, out);
  return out;
}

void TensorParallel::gather_into(const PlannedParameter& e, const Tensor& shard, const Tensor& out) const {
  // The members' shards may differ in size (an uneven vocabulary): each is sent in a buffer of the
  // largest, then put in its place. The buffers are kept: whole copies gather every step.
  std::int64_t largest = 0;
  for (int r = 0; r < size(); ++r)
    largest = std::max(largest, tensor_plan::shard_shape(e.whole, e.placement, r, size()).numel());
  mine_.assign(static_cast<std::size_t>(largest), 0.0f);
  all_.resize(static_cast<std::size_t>(largest * size()));
  const Tensor c = shard.is_contiguous() ? shard : shard.clone();
  std::memcpy(mine_.data(), c.data<float>(), static_cast<std::size_t>(c.numel()) * sizeof(float));
  group_->all_gather(std::span<const float>(mine_), std::span<float>(all_));
  for (int r = 0; r < size(); ++r)
    tensor_plan::insert_shard(all_.data() + static_cast<std::size_t>(r * largest), e.whole, e.placement, r, size(),
                              out.data<float>());
}

Tensor TensorParallel::shard(const std::string& entry, const Tensor& whole) const {
  const PlannedParameter* e = planned(entry);
  if (!e || !e->placement.is_split() || !(whole.shape() == e->whole) || held_whole(entry)) return whole;
  Tensor out = Tensor::zeros(tensor_plan::shard_shape(e->whole, e->placement, rank(), size()));
  tensor_plan::extract_shard(whole.data<float>(), e->whole, e->placement, rank(), size(), out.data<float>());
  return out;
}

Parameter* TensorParallel::whole_copy(Parameter* shard) {
  const PlannedParameter* e = planned(shard);
  if (!e || !e->placement.is_split()) return shard;
  Parameter& whole = copy_storage_.emplace_back(shard->name(), this->whole(shard->name(), shard->data()));
  Tensor grad = Tensor::zeros(e->whole);
  whole.set_grad_buffer(grad);
  whole.set_requires_grad(shard->requires_grad());
  copies_.push_back({shard, &whole, grad});
  copied_names_.insert(shard->name());
  return &whole;
}

void TensorParallel::before_update() {
  for (Copy& c : copies_) {
    // Every member reached the parameter or none did (they run the same graph).
    if (!c.shard->has_grad()) {
      c.whole->zero_grad();
      continue;
    }
    gather_into(*planned(c.shard), c.shard->grad(), c.grad);
    c.whole->mark_grad_written();
  }
}

void TensorParallel::after_update() {
  for (Copy& c : copies_) {
    const PlannedParameter& e = *planned(c.shard);
    tensor_plan::extract_shard(c.whole->data().data<float>(), e.whole, e.placement, rank(), size(),
                               c.shard->data().data<float>());
  }
}

void TensorParallel::shards_changed() {
  for (Copy& c : copies_) gather_into(*planned(c.shard), c.shard->data(), c.whole->data());
}

bool TensorParallel::held_whole(const std::string& entry) const {
  const auto slash = entry.find('/');
  return slash != std::string::npos && !entry.starts_with("ema/") && copied_names_.contains(entry.substr(slash + 1));
}

std::string TensorParallel::describe() const {
  std::size_t split = 0;
  std::int64_t local = 0, total = 0;
  std::set<std::string> styles;
  for (const auto& e : plan_) {
    local += e.parameter->shape().numel();
    total += e.whole.numel();
    if (e.placement.is_split()) {
      ++split;
      styles.insert(e.placement.style);
    }
  }
  std::ostringstream s;
  s << "tensor " << size() << ": " << split << " of " << plan_.size() << " parameters split (";
  bool first = true;
  for (const auto& st : styles) {
    s << (first ? "" : ", ") << st;
    first = false;
  }
  s << "), " << std::fixed << std::setprecision(1) << 100.0 * static_cast<double>(local) / static_cast<double>(total)
    << "% of the weights on each rank";
  return s.str();
}

}  // namespace loom::training
