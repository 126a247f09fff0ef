#include "train/fsdp.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <unordered_set>

#include "loom/allocator.hpp"
#include "loom/core/storage.hpp"
#include "loom/error.hpp"

namespace loom::training {

namespace {

constexpr std::int64_t kAlign = 16;  // floats: 64 bytes, one cache line, one AVX-512 vector

std::int64_t round_up(std::int64_t n, std::int64_t to) {
  return (n + to - 1) / to * to;
}

using Clock = std::chrono::steady_clock;

}  // namespace

FullySharded::FullySharded(CollectiveGroup& world, std::shared_ptr<CollectiveGroup> fsdp,
                           std::shared_ptr<CollectiveGroup> data, Model& model,
                           const std::vector<ModelParameter>& trained, const FsdpSettings& settings)
    : world_(world), fsdp_(std::move(fsdp)), data_(std::move(data)), settings_(settings) {
  const std::int64_t shards = fsdp_->size(), rank = fsdp_->rank();
  const std::vector<ModelParameter> all = model.parameters();
  std::unordered_map<const Parameter*, ParameterRole> role;
  for (const auto& p : all) {
    role[p.parameter] = p.role;
    order_.push_back(p.parameter);
  }
  std::unordered_set<const Parameter*> trains;
  for (const auto& p : trained) trains.insert(p.parameter);

  std::vector<ShardingUnit> declared = model.sharding_units();
  if (declared.empty()) {
    ShardingUnit whole{"the whole model", {}};
    for (const auto& p : all) whole.parameters.push_back(p.parameter);
    declared.push_back(std::move(whole));
  }
  std::unordered_set<const Parameter*> seen;
  for (const auto& u : declared)
    for (Parameter* p : u.parameters) {
      if (!role.contains(p))
        throw InternalError("sharding unit '" + u.name +
                            "' of the model lists a parameter that is not among its "
                            "parameters(): '" +
                            (p ? p->name() : std::string("null")) + "'");
      if (!seen.insert(p).second)
        throw InternalError("parameter '" + p->name() + "' is in two of the model's sharding units");
      if (&p->tensor().buffer_type() != &host_buffer_type())
        throw UserError("trainer.mesh's fsdp axis needs the parameters in host memory; '" + p->name() + "' is on " +
                        p->tensor().device().str() + " (a backend other than cpu or reference)");
    }
  for (const auto& p : all)
    if (!seen.contains(p.parameter))
      throw InternalError("parameter '" + p.parameter->name() + "' is in none of the model's sharding units");

  // Whole-matrix optimizers: each trained parameter to the least loaded rank, largest first.
  std::unordered_map<const Parameter*, int> owner;
  if (!settings_.elementwise_optimizer) {
    std::vector<Parameter*> order;
    for (const auto& p : all)
      if (trains.contains(p.parameter)) order.push_back(p.parameter);
    std::stable_sort(order.begin(), order.end(),
                     [](Parameter* a, Parameter* b) { return a->shape().numel() > b->shape().numel(); });
    std::vector<std::int64_t> load(static_cast<std::size_t>(shards), 0);
    for (Parameter* p : order) {
      const auto least = std::min_element(load.begin(), load.end()) - load.begin();
      owner[p] = static_cast<int>(least);
      load[static_cast<std::size_t>(least)] += p->shape().numel();
    }
  }

  // The model's parameter memory, given back once every parameter lives in a unit.
  std::vector<Tensor> old_values;
  std::unordered_map<const Parameter*, Parameter*> piece_of;
  for (auto& declared_unit : declared) {
    if (declared_unit.parameters.empty()) continue;
    Unit unit;
    unit.name = declared_unit.name;
    std::int64_t filled = 0;
    for (Parameter* p : declared_unit.parameters) {
      Member m;
      m.parameter = p;
      m.offset = filled;
      m.numel = p->shape().numel();
      m.trained = trains.contains(p);
      if (const auto it = owner.find(p); it != owner.end()) m.owner = it->second;
      filled += round_up(m.numel, kAlign);
      unit.members.push_back(m);
    }
    // A multiple of the data axis too: with replicas, each rank reduces 1/data of its chunk.
    unit.chunk = round_up((filled + shards - 1) / shards, kAlign * data_->size());
    const std::int64_t full = unit.chunk * shards;
    unit.home = Tensor::zeros(Shape{full});
    float* home = unit.home.data<float>();
    for (Member& m : unit.members) {
      const Tensor v = m.parameter->data();
      std::memcpy(home + m.offset, v.data<float>(), static_cast<std::size_t>(m.numel) * sizeof(float));
      if (!settings_.elementwise_optimizer && m.trained && m.owner == rank) {
        Parameter& whole = pieces_.emplace_back(m.parameter->name(), v.clone());
        m.whole_grad = Tensor::zeros(m.parameter->shape());
        whole.set_grad_buffer(m.whole_grad);
        m.whole = &whole;
      }
      old_values.push_back(m.parameter->tensor().detach());
    }
    unit.shard = Tensor::empty(Shape{unit.chunk});
    std::memcpy(unit.shard.data<float>(), home + rank * unit.chunk,
                static_cast<std::size_t>(unit.chunk) * sizeof(float));
    unit.shard_grad = Tensor::zeros(Shape{unit.chunk});
    unit.grad_home = Tensor::empty(Shape{full});
    for (Member& m : unit.members) {
      const Shape shape = m.parameter->shape();
      core::rebind_parameter(*m.parameter, unit.home.slice(0, m.offset, m.offset + m.numel).view(shape));
      m.parameter->zero_grad();
      m.parameter->set_grad_buffer(unit.grad_home.slice(0, m.offset, m.offset + m.numel).view(shape));
      // This rank's range of the parameter: at most one contiguous piece.
      const std::int64_t lo = std::max(m.offset, rank * unit.chunk),
                         hi = std::min(m.offset + m.numel, (rank + 1) * unit.chunk);
      if (hi > lo) {
        const std::int64_t at = lo - rank * unit.chunk;
        Parameter& piece = pieces_.emplace_back(m.parameter->name(), unit.shard.slice(0, at, at + hi - lo));
        piece.set_grad_buffer(unit.shard_grad.slice(0, at, at + hi - lo));
        piece.set_requires_grad(settings_.elementwise_optimizer && m.trained);
        m.piece = &piece;
        piece_of[m.parameter] = &piece;
        slices_.push_back({m.parameter, &piece, lo - m.offset, hi - m.offset});
      }
    }
    core::rebind_host_storage(unit.home, 0);
    core::rebind_host_storage(unit.grad_home, 0);
    const std::size_t index = units_.size();
    for (std::size_t i = 0; i < unit.members.size(); ++i) where_[unit.members[i].parameter] = {index, i};
    units_.push_back(std::move(unit));
  }
  // Slices and trained parameters in the model's order.
  std::unordered_map<const Parameter*, std::size_t> position;
  for (std::size_t i = 0; i < all.size(); ++i) position[all[i].parameter] = i;
  std::sort(slices_.begin(), slices_.end(),
            [&](const ParameterSlice& a, const ParameterSlice& b) { return position[a.model] < position[b.model]; });
  for (const auto& p : all) {
    if (!trains.contains(p.parameter)) continue;
    const auto [u, i] = where_.at(p.parameter);
    const Member& m = units_[u].members[i];
    if (settings_.elementwise_optimizer) {
      if (const auto it = piece_of.find(p.parameter); it != piece_of.end()) trained_.push_back({it->second, p.role});
    } else if (m.whole) {
      trained_.push_back({m.whole, p.role});
    }
  }
  // Every value now lives in a unit: the model's own buffers hold nothing anyone reads.
  for (const Tensor& t : old_values)
    if (t.storage_use_count() > 0) core::rebind_host_storage(t, 0);
  old_values.clear();
  allocator_release_cached();
}

FullySharded::~FullySharded() {
  // Reductions and gathers in flight read and write the units' memory: let them finish.
  for (auto& u : units_) {
    if (u.gathering) u.gathering->wait();
    for (auto& r : u.reducing) r->wait();
  }
}

std::int64_t FullySharded::largest_unit_bytes() const {
  std::int64_t largest = 0;
  for (const auto& u : units_) largest = std::max(largest, u.chunk * fsdp_->size() * std::int64_t{4});
  return largest;
}

FullySharded::Unit& FullySharded::unit_of(Parameter& p) {
  return units_[where_.at(&p).first];
}

void FullySharded::note_use(Unit& unit, Member& m) {
  if (m.used_stamp == micro_stamp_) return;
  m.used_stamp = micro_stamp_;
  ++unit.used;
  if (m.trained) ++unit.used_trained;
}

void FullySharded::begin_step() {
  for (auto& u : units_) u.grad_started = false;
}

void FullySharded::attach(Ops& ops) {
  current_ = static_cast<std::size_t>(-1);
  forward_at_ = 0;
  ops.set_parameter_observer([this](Parameter& p) { use_forward(p); });
}

void FullySharded::attach(Tape& tape) {
  ++micro_stamp_;
  in_backward_ = false;
  backward_at_ = 0;
  for (auto& u : units_) {
    u.used = u.used_trained = u.ready = 0;
    for (auto& m : u.members) m.parameter->zero_grad();
  }
  tape.on_parameter_needed([this](Parameter& p, bool values) { needed(p, values); });
  tape.on_gradient_ready([this](Parameter& p) { gradient_ready(p); });
}

void FullySharded::use_forward(Parameter& p) {
  const auto it = where_.find(&p);
  if (it == where_.end()) return;  // not the model's (an adapter)
  const std::size_t u = it->second.first;
  Unit& unit = units_[u];
  note_use(unit, unit.members[it->second.second]);
  if (in_backward_) {  // a checkpointed segment, recomputed
    if (!unit.gathered)
      gather(u, true);
    else
      wait_gather(unit);
    return;
  }
  if (u == current_ && unit.gathered) {
    wait_gather(unit);
    return;
  }
  // The forward pass moves on to another unit: the ones before it are done with (until the
  // backward pass, or a later use such as tied embeddings' output layer).
  if (settings_.reshard_after_forward)
    for (std::size_t v = 0; v < units_.size(); ++v)
      if (v != u && units_[v].gathered && !units_[v].gathering) free_values(v);
  if (!unit.gathered)
    gather(u, true);
  else
    wait_gather(unit);
  current_ = u;
  if (!orders_recorded_ && micro_stamp_ > 0) forward_order_.push_back(u);
  prefetch_after(forward_order_, forward_at_, u, !orders_recorded_);
}

void FullySharded::prefetch_after(std::vector<std::size_t>& sequence, std::size_t& position, std::size_t u,
                                  bool recording) {
  if (recording || !settings_.prefetch) return;
  if (position >= sequence.size() || sequence[position] != u) {
    position = sequence.size();  // off the recorded order: no more guesses this pass
    return;
  }
  ++position;
  if (position < sequence.size() && !units_[sequence[position]].gathered) gather(sequence[position], false);
}

void FullySharded::needed(Parameter& p, bool values) {
  const auto it = where_.find(&p);
  if (it == where_.end()) return;
  const std::size_t u = it->second.first;
  Unit& unit = units_[u];
  if (!in_backward_) {
    // The backward pass starts: it gathers what its operations read, so the forward pass's units
    // go (a unit no backward operation reads, as tied embeddings', is not gathered again).
    in_backward_ = true;
    current_ = static_cast<std::size_t>(-1);
    if (settings_.reshard_after_forward)
      for (std::size_t v = 0; v < units_.size(); ++v)
        if (units_[v].gathered && !units_[v].gathering) free_values(v);
  }
  if (values) {
    if (!unit.gathered)
      gather(u, true);
    else
      wait_gather(unit);
    if (current_ != u) {
      current_ = u;
      if (!orders_recorded_) backward_order_.push_back(u);
      prefetch_after(backward_order_, backward_at_, u, !orders_recorded_);
    }
  }
  if (unit.used_trained > 0) ensure_grad(unit);
}

void FullySharded::gradient_ready(Parameter& p) {
  const auto it = where_.find(&p);
  if (it == where_.end()) return;
  const std::size_t u = it->second.first;
  Unit& unit = units_[u];
  // Every parameter of the unit this pass took is past its first use: no operation left reads
  // the unit's weights or adds to its gradients.
  if (++unit.ready < unit.used) return;
  if (unit.grad_live && unit.reducing.empty())
    start_reduce(u);
  else
    free_values(u);
}

void FullySharded::gather(std::size_t u, bool wait) {
  Unit& unit = units_[u];
  if (unit.gathered) {
    if (wait) wait_gather(unit);
    return;
  }
  const std::size_t full = static_cast<std::size_t>(unit.chunk * fsdp_->size());
  core::rebind_host_storage(unit.home, full * sizeof(float));
  unit.gathered = true;
  bytes_moved_ += static_cast<std::int64_t>(full * sizeof(float));
  unit.gathering =
      fsdp_->start_all_gather(std::span<const float>(unit.shard.data<float>(), static_cast<std::size_t>(unit.chunk)),
                              std::span<float>(unit.home.data<float>(), full));
  if (wait) wait_gather(unit);
}

void FullySharded::wait_gather(Unit& unit) {
  if (!unit.gathering) return;
  const auto start = Clock::now();
  unit.gathering->wait();
  unit.gathering.reset();
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
}

void FullySharded::free_values(std::size_t u) {
  Unit& unit = units_[u];
  if (!unit.gathered) return;
  wait_gather(unit);
  core::rebind_host_storage(unit.home, 0);
  unit.gathered = false;
  if (current_ == u) current_ = static_cast<std::size_t>(-1);
}

void FullySharded::ensure_grad(Unit& unit) {
  if (unit.grad_live) return;
  core::rebind_host_storage(unit.grad_home, static_cast<std::size_t>(unit.chunk * fsdp_->size()) * sizeof(float));
  unit.grad_live = true;
}

void FullySharded::start_reduce(std::size_t u) {
  Unit& unit = units_[u];
  const std::int64_t shards = fsdp_->size(), rank = fsdp_->rank(), full = unit.chunk * shards;
  float* g = unit.grad_home.data<float>();
  // What no gradient was written to (a parameter this micro-batch did not reach, the padding)
  // contributes zeros.
  std::int64_t at = 0;
  for (Member& m : unit.members) {
    if (m.offset > at) std::memset(g + at, 0, static_cast<std::size_t>(m.offset - at) * sizeof(float));
    const bool has = m.trained && m.parameter->has_grad();
    if (!has) std::memset(g + m.offset, 0, static_cast<std::size_t>(m.numel) * sizeof(float));
    m.had_grad |= has;
    at = m.offset + m.numel;
  }
  if (full > at) std::memset(g + at, 0, static_cast<std::size_t>(full - at) * sizeof(float));
  bytes_moved_ += full * std::int64_t{4};
  // Every rank's gradients are summed in world rank order, as one process sums its micro-batches
  // in order (the collective's reduce-scatter sums in rank order): one micro-batch per rank
  // trains bit for bit as one process does.
  const std::int64_t replicas = data_->size();
  if (!settings_.elementwise_optimizer) {
    unit.reducing.push_back(world_.start_all_reduce(std::span<float>(g, static_cast<std::size_t>(full))));
  } else if (replicas == 1) {
    // In place: this rank's chunk of the buffer receives its sum.
    unit.reducing.push_back(
        fsdp_->start_reduce_scatter(std::span<const float>(g, static_cast<std::size_t>(full)),
                                    std::span<float>(g + rank * unit.chunk, static_cast<std::size_t>(unit.chunk))));
  } else {
    // World rank d * F + f sums slice d of chunk f (a reduce-scatter over the world of the chunks'
    // slices in world order), then the replicas gather their chunk's slices.
    const std::int64_t slice = unit.chunk / replicas, d = data_->rank();
    if (!unit.scratch.defined() || unit.scratch.numel() != full) unit.scratch = Tensor::empty(Shape{full});
    float* permuted = unit.scratch.data<float>();
    for (std::int64_t f = 0; f < shards; ++f)
      for (std::int64_t r = 0; r < replicas; ++r)
        std::memcpy(permuted + (r * shards + f) * slice, g + f * unit.chunk + r * slice,
                    static_cast<std::size_t>(slice) * sizeof(float));
    float* mine = g + rank * unit.chunk;
    unit.reducing.push_back(
        world_.start_reduce_scatter(std::span<const float>(permuted, static_cast<std::size_t>(full)),
                                    std::span<float>(mine + d * slice, static_cast<std::size_t>(slice))));
    unit.reducing.push_back(
        data_->start_all_gather(std::span<const float>(mine + d * slice, static_cast<std::size_t>(slice)),
                                std::span<float>(mine, static_cast<std::size_t>(unit.chunk))));
  }
  reducing_.push_back(u);
  free_values(u);
  // Two reductions in flight at most: each holds a unit's gradients.
  while (reducing_.size() > 2) {
    const std::size_t oldest = reducing_.front();
    reducing_.erase(reducing_.begin());
    finish_reduce(oldest);
  }
}

void FullySharded::finish_reduce(std::size_t u) {
  Unit& unit = units_[u];
  if (unit.reducing.empty()) return;
  const auto start = Clock::now();
  for (auto& r : unit.reducing) r->wait();
  unit.reducing.clear();
  unit.scratch = Tensor();
  communication_seconds_ += std::chrono::duration<double>(Clock::now() - start).count();
  const float* g = unit.grad_home.data<float>();
  if (settings_.elementwise_optimizer) {
    const float* mine = g + fsdp_->rank() * unit.chunk;
    float* acc = unit.shard_grad.data<float>();
    if (!unit.grad_started)
      std::memcpy(acc, mine, static_cast<std::size_t>(unit.chunk) * sizeof(float));
    else
      for (std::int64_t i = 0; i < unit.chunk; ++i) acc[i] += mine[i];
  } else {
    for (Member& m : unit.members) {
      if (!m.whole) continue;
      float* acc = m.whole_grad.data<float>();
      if (!unit.grad_started)
        std::memcpy(acc, g + m.offset, static_cast<std::size_t>(m.numel) * sizeof(float));
      else
        for (std::int64_t i = 0; i < m.numel; ++i) acc[i] += g[m.offset + i];
    }
  }
  unit.grad_started = true;
  core::rebind_host_storage(unit.grad_home, 0);
  unit.grad_live = false;
}

void FullySharded::end_micro_batch() {
  // Gradients that no ready signal completed (a parameter taken outside the tape).
  for (std::size_t u = units_.size(); u-- > 0;)
    if (units_[u].grad_live && units_[u].reducing.empty()) start_reduce(u);
  for (const std::size_t u : reducing_) finish_reduce(u);
  reducing_.clear();
  release();
  in_backward_ = false;
  if (!orders_recorded_ && !forward_order_.empty()) orders_recorded_ = true;
}

void FullySharded::finish_gradients() {
  flags_.clear();
  for (const auto& u : units_)
    for (const auto& m : u.members)
      if (m.trained) flags_.push_back(m.had_grad ? 1.0f : 0.0f);
  CollectiveGroup& reached = settings_.reached_group ? *settings_.reached_group : world_;
  if (reached.size() > 1) reached.all_reduce(std::span<float>(flags_), ReduceOp::max);
  std::size_t i = 0;
  for (auto& u : units_)
    for (auto& m : u.members) {
      if (!m.trained) continue;
      const bool reached = flags_[i++] != 0.0f;
      m.had_grad = false;
      // What this rank's optimizer updates of it: its slice, or its whole copy on the owner.
      Parameter* updated = settings_.elementwise_optimizer ? m.piece : m.whole;
      if (!updated) continue;
      if (reached)
        updated->mark_grad_written();
      else
        updated->zero_grad();
    }
}

double FullySharded::sum_over_shards(double value) {
  fsdp_->all_reduce(std::span<double>(&value, 1));
  return value;
}

void FullySharded::owners_changed() {
  if (settings_.elementwise_optimizer) return;
  const std::int64_t shards = fsdp_->size(), rank = fsdp_->rank();
  for (auto& unit : units_) {
    const std::size_t full = static_cast<std::size_t>(unit.chunk * shards);
    core::rebind_host_storage(unit.home, full * sizeof(float));
    float* home = unit.home.data<float>();
    std::memset(home, 0, full * sizeof(float));
    // Each element from exactly one rank: a trained parameter from its owner, the rest (frozen
    // parameters, padding) from the rank whose chunk it is.
    std::memcpy(home + rank * unit.chunk, unit.shard.data<float>(),
                static_cast<std::size_t>(unit.chunk) * sizeof(float));
    for (const Member& m : unit.members) {
      if (!m.trained) continue;
      const std::int64_t lo = std::max(m.offset, rank * unit.chunk),
                         hi = std::min(m.offset + m.numel, (rank + 1) * unit.chunk);
      if (hi > lo) std::memset(home + lo, 0, static_cast<std::size_t>(hi - lo) * sizeof(float));
      if (m.whole)
        std::memcpy(home + m.offset, m.whole->data().data<float>(), static_cast<std::size_t>(m.numel) * sizeof(float));
    }
    fsdp_->all_reduce(std::span<float>(home, full));
    bytes_moved_ += static_cast<std::int64_t>(full * sizeof(float));
    std::memcpy(unit.shard.data<float>(), home + rank * unit.chunk,
                static_cast<std::size_t>(unit.chunk) * sizeof(float));
    core::rebind_host_storage(unit.home, 0);
  }
}

void FullySharded::shards_changed() {
  if (settings_.elementwise_optimizer) return;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    gather(u, true);
    for (const Member& m : units_[u].members)
      if (m.whole) m.whole->data().copy_from(m.parameter->data());
    free_values(u);
  }
}

void FullySharded::release() {
  for (std::size_t u = 0; u < units_.size(); ++u) free_values(u);
  current_ = static_cast<std::size_t>(-1);
}

std::vector<std::pair<std::string, Tensor>> FullySharded::gather_full() {
  std::unordered_map<const Parameter*, Tensor> values;
  for (std::size_t u = 0; u < units_.size(); ++u) {
    gather(u, true);
    for (const Member& m : units_[u].members) values[m.parameter] = m.parameter->data().clone();
    free_values(u);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  for (Parameter* p : order_) out.emplace_back(p->name(), std::move(values.at(p)));
  return out;
}

std::int64_t FullySharded::take_bytes_moved() {
  const std::int64_t b = bytes_moved_;
  bytes_moved_ = 0;
  return b;
}

double FullySharded::take_communication_seconds() {
  const double s = communication_seconds_;
  communication_seconds_ = 0;
  return s;
}

}  // namespace loom::training
