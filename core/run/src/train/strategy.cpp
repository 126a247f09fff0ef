#include "train/strategy.hpp"

#include <algorithm>
#include <cstring>
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "loom/error.hpp"
#include "train/checkpointing.hpp"
#include "train/components.hpp"
#include "train/data_parallel.hpp"
#include "train/progress.hpp"
#include "train/resume.hpp"

namespace loom::training {

namespace {

// Fully sharded data parallelism: the model's trained parameters in sharded units, gathered for
// each pass and reduce-scattered as their gradients are final (train/fsdp.hpp).
class FsdpStrategy final : public Strategy {
 public:
  // `adapters_saved`: the final weights are LoRA's adapters, outside the units (held whole).
  // `trained`: the parameters this rank updates (its slices, or whole owned parameters, and the
  // adapters); `fsdp_group`, `data_group`: the mesh's groups along those axes; `elementwise`: the
  // optimizer's state has the shape of what it updates (Optimizer::elementwise).
  FsdpStrategy(FullySharded& fsdp, bool adapters_saved, Model& model, const std::vector<ModelParameter>& trained,
               std::shared_ptr<CollectiveGroup> fsdp_group, std::shared_ptr<CollectiveGroup> data_group,
               bool elementwise)
      : fsdp_(fsdp),
        adapters_saved_(adapters_saved),
        fsdp_group_(std::move(fsdp_group)),
        data_group_(std::move(data_group)),
        elementwise_(elementwise) {
    for (const ParameterSlice& sl : fsdp_.slices()) slice_of_[sl.model->name()] = &sl;
    for (const auto& p : model.parameters()) model_of_[p.parameter->name()] = p.parameter;
    for (const auto& p : trained) updates_.insert(p.parameter->name());
  }

  bool sums_micro_batches() const override { return true; }
  void begin_step() override { fsdp_.begin_step(); }
  void attach(Tape& tape, const MicroBatchTape&) override { fsdp_.attach(tape); }
  void attach(Ops& ops) override { fsdp_.attach(ops); }
  void end_micro_batch() override { fsdp_.end_micro_batch(); }
  void finish_gradients(const std::vector<ModelParameter>&) override { fsdp_.finish_gradients(); }
  // The slices (or owned wholes) first in the trained parameters; the parameters every rank holds
  // whole after them (LoRA's adapters), whose squares are not summed over the shards.
  std::optional<NormPart> norm_part(std::size_t index, const Parameter&) const override {
    if (index >= fsdp_.trained().size()) return NormPart::replicated;
    return std::nullopt;
  }
  // Each rank holds its slices (or its whole parameters) once along the fsdp axis; the replicas
  // along the data axis hold the same.
  void contribute_to_norm(NormParts& parts) override { parts.local = fsdp_.sum_over_shards(parts.local); }
  void after_update() override { fsdp_.owners_changed(); }
  void release() override { fsdp_.release(); }
  const char* runs_model_together() const override { return "fully sharded data parallelism"; }
  std::optional<bool> draws_samples() const override { return false; }
  void parameters_swapped() override { fsdp_.owners_changed(); }
  bool holds_saved_in_parts() const override { return !adapters_saved_; }
  std::optional<std::vector<std::pair<std::string, Tensor>>> gather_model() override {
    if (adapters_saved_) return std::nullopt;
    return fsdp_.gather_full();
  }
  // A parameter's entry from the members' slices: the slices of the fsdp group are disjoint, so
  // the entry (whole along the axis: a tensor-parallel shard under a tensor axis) is the sum over
  // the group of each member's slice put in place in zeros (exact). An entry that is no
  // parameter's is this rank's own.
  std::optional<Tensor> whole(const std::string& name, const Tensor& t) override {
    const auto m = model_of_.find(parameter_of(name));
    if (m == model_of_.end()) return std::nullopt;
    Tensor shard = Tensor::zeros(m->second->shape());
    const ParameterSlice* sl = slice(m->first);
    if (t.defined() && sl && t.numel() == sl->end - sl->begin)
      std::memcpy(shard.data<float>() + sl->begin, t.data<float>(),
                  static_cast<std::size_t>(t.numel()) * sizeof(float));
    fsdp_group_->all_reduce(std::span<float>(shard.data<float>(), static_cast<std::size_t>(shard.numel())));
    return shard;
  }

  // A checkpoint of parts: each rank's slice of every parameter, of the optimizer state of the
  // slices it updates (elementwise optimizers) or the whole state of the parameters it owns, and
  // of the weight average; written by the replicas of data index 0 alone. Under LoRA a checkpoint
  // holds the adapters (and their optimizer state and average), which every rank holds whole and
  // alike, and no base weights (they come from init_from again): rank 0 writes its copy.
  CheckpointWriting checkpoint_writing() const override {
    return adapters_saved_ ? CheckpointWriting::copy : CheckpointWriting::parts;
  }
  void hold(CheckpointEntries& entries) const override {
    if (adapters_saved_) return;
    entries.model.clear();
    for (const ParameterSlice& sl : fsdp_.slices())
      entries.model.emplace_back(sl.model->name(), sl.piece->data(), sl.model->shape(), sl.begin, sl.end);
    if (!elementwise_) return;
    for (auto* list : {&entries.optimizer, &entries.average})
      for (checkpoint::Entry& e : *list)
        if (const ParameterSlice* sl = slice(parameter_of(e.name)))
          e = checkpoint::Entry(e.name, e.data, sl->model->shape(), sl->begin, sl->end);
  }
  // (Its parts' model files have never carried the run's name and step: kept so, for their bits.)
  void keep_part(CheckpointEntries& entries) const override {
    entries.model_metadata.clear();
    if (data_group_->rank() == 0) return;
    entries.model.clear();
    entries.optimizer.clear();
    entries.average.clear();
  }
  // A rank holding no slice of a parameter holds none of its optimizer state.
  bool holds_some_entries() const override { return !adapters_saved_; }

  // This rank's slices of the weights, and of the state and average of the slices it updates
  // (elementwise optimizers) or the whole state of the parameters it owns; whatever mesh wrote the
  // checkpoint.
  void share(RankShare& share) const override {
    if (adapters_saved_) return;  // the adapters, whole on every rank
    for (const ParameterSlice& sl : fsdp_.slices()) share.weights.emplace_back(sl.piece, sl.model->shape());
    share.keeps = [this](const std::string& entry) { return updates_.contains(parameter_of(entry)); };
    share.keeps_average = share.keeps;
    share.range = [this](const std::string& entry) -> std::optional<std::pair<std::int64_t, std::int64_t>> {
      if (entry.find('/') != std::string::npos && !elementwise_) return std::nullopt;  // a slot's entry
      const ParameterSlice* sl = slice(parameter_of(entry));
      if (!sl) return std::nullopt;
      return std::pair{sl->begin, sl->end};
    };
  }
  void checkpoint_loaded() override { fsdp_.shards_changed(); }
  // (The ranks' weights were compared before they were sharded.)
  bool holds_different_parameters() const override { return true; }

  void describe(RunHeader& header) const override {
    header.fully_sharded =
        std::to_string(fsdp_.num_units()) + " units, the largest " +
        format_bytes(static_cast<std::uint64_t>(fsdp_.largest_unit_bytes())) +
        " when gathered; parameters, gradients and optimizer state 1/" + std::to_string(fsdp_.shards()) + " per rank" +
        (fsdp_.settings().reshard_after_forward ? "" : "; units kept from the forward to the backward pass");
  }
  double take_communication_seconds() override { return fsdp_.take_communication_seconds(); }
  // The bytes this rank's gathers and reductions moved per step since the last line.
  void take_metrics(std::vector<std::pair<std::string, double>>& scalars, std::int64_t steps) override {
    scalars.emplace_back("throughput/fsdp_bytes_per_step", static_cast<double>(fsdp_.take_bytes_moved()) /
                                                               static_cast<double>(std::max<std::int64_t>(1, steps)));
  }

 private:
  // This rank's slice of parameter `name`, or null.
  const ParameterSlice* slice(const std::string& name) const {
    const auto it = slice_of_.find(name);
    return it == slice_of_.end() ? nullptr : it->second;
  }

  FullySharded& fsdp_;
  bool adapters_saved_;
  std::shared_ptr<CollectiveGroup> fsdp_group_, data_group_;
  bool elementwise_;
  std::unordered_map<std::string, const ParameterSlice*> slice_of_;  // by the model parameter's name
  std::unordered_map<std::string, const Parameter*> model_of_;       // the model's parameters
  std::unordered_set<std::string> updates_;                          // the parameters this rank updates
};

// The data axis: the gradients of the parameters every rank of it holds whole, summed in buckets
// (during the last micro-batch's backward pass when overlapped), or ZeRO-1's shards: reduce-
// scattered, each rank updating its shard, the updated weights gathered (train/data_parallel.hpp).
// Under FSDP it carries the parameters outside the units (LoRA's adapters), where there are any.
class DataAxisStrategy final : public Strategy {
 public:
  // `trained`: the parameters the optimizer updates; `saved`: those a checkpoint holds.
  DataAxisStrategy(DataParallel& data, bool overlap_reduce, bool on_tape, bool reduces,
                   const std::vector<ModelParameter>& trained, const std::vector<ModelParameter>& saved)
      : data_(data), overlap_(overlap_reduce && data.world().size() > 1 && on_tape), reduces_(reduces) {
    for (const auto& p : trained)
      if (data.owns(p.parameter)) owned_.insert(p.parameter->name());
    for (const auto& p : saved) saved_[p.parameter->name()] = p.parameter;
  }

  // The rank's last micro-batch: each gradient, once final (and added to the earlier
  // micro-batches' sum), joins its bucket's reduction while backward goes on.
  void attach(Tape& tape, const MicroBatchTape& micro) override {
    if (!micro.last || !overlap_) return;
    if (micro.complete)
      tape.on_gradient_ready([this, complete = *micro.complete](Parameter& p) {
        complete(p);
        data_.gradient_ready(p);
      });
    else
      tape.on_gradient_ready([this](Parameter& p) { data_.gradient_ready(p); });
  }
  // Every bucket's reduction is posted now, whatever this rank's micro-batches reached.
  void end_backward() override { data_.start_remaining_buckets(); }
  void finish_gradients(const std::vector<ModelParameter>&) override {
    if (reduces_) data_.reduce_gradients();
  }
  // ZeRO-1: each rank's squares are its shard's.
  void contribute_to_norm(NormParts& parts) override {
    if (data_.sharded()) parts.local = data_.world().sum(parts.local);
  }
  void after_update() override { data_.gather_parameters(); }

  // ZeRO-1: a checkpoint of parts. Each rank writes the parameters it owns (rank 0 those no rank
  // updates), its optimizer's state (which holds only what it updates) and the weight average of
  // the parameters it writes (every rank holds all of it).
  CheckpointWriting checkpoint_writing() const override {
    return data_.sharded() ? CheckpointWriting::parts : CheckpointWriting::copy;
  }
  void keep_part(CheckpointEntries& entries) const override {
    if (!data_.sharded()) return;
    std::unordered_set<std::string> mine;
    std::erase_if(entries.model, [&](const checkpoint::Entry& e) {
      const auto it = saved_.find(e.name);
      if (data_.checkpoint_writer_of(it == saved_.end() ? nullptr : it->second) != data_.world().rank()) return true;
      mine.insert(e.name);
      return false;
    });
    std::erase_if(entries.average, [&](const checkpoint::Entry& e) { return !mine.contains(parameter_of(e.name)); });
  }
  // A sharded rank loads its shard's entries of the whole saved state.
  void share(RankShare& share) const override {
    if (data_.sharded())
      share.keeps = [this](const std::string& entry) { return owned_.contains(parameter_of(entry)); };
  }
  double take_communication_seconds() override { return data_.take_communication_seconds(); }

 private:
  DataParallel& data_;
  bool overlap_;
  bool reduces_;
  std::unordered_set<std::string> owned_;                    // ZeRO-1: the parameters this rank updates
  std::unordered_map<std::string, const Parameter*> saved_;  // what a checkpoint holds, by name
};

// The tensor axis: the model splits its matrices over the tensor group and communicates inside
// its forward pass through the Ops' group; the step sums the partial gradients of replicated
// parameters and counts the shards' squares once (train/tensor_parallel.hpp).
class TensorStrategy final : public Strategy {
 public:
  // `agree`: the members agree on which split parameters any of them reached (FSDP does it for its
  // units, over every rank, when it is there).
  TensorStrategy(TensorParallel& tensor, bool agree) : tensor_(tensor), agree_(agree) {}

  void attach(Ops& ops) override { tensor_.attach(ops); }
  void finish_gradients(const std::vector<ModelParameter>& trained) override {
    if (agree_) tensor_.agree_on_gradients(trained);
    tensor_.reduce_partial_gradients(trained);
  }
  std::optional<NormPart> norm_part(std::size_t, const Parameter& p) const override {
    if (tensor_.is_split(&p)) return NormPart::split;
    return std::nullopt;
  }
  // The split shards' squares, summed over the members (the replicated parameters are the same on
  // every member: counted once).
  void contribute_to_norm(NormParts& parts) override {
    parts.local += tensor_.sum_over_members(parts.split);
    parts.split = 0;
  }
  void before_update() override { tensor_.before_update(); }
  void after_update() override { tensor_.after_update(); }
  const char* runs_model_together() const override { return "tensor parallelism"; }
  std::optional<bool> draws_samples() const override { return true; }
  bool holds_saved_in_parts() const override { return true; }
  std::optional<Tensor> whole(const std::string& name, const Tensor& t) override {
    const PlannedParameter* e = tensor_.planned(name);
    if (!e || !e->placement.is_split()) return std::nullopt;
    return tensor_.whole(name, t);
  }
  // Checkpoints hold whole tensors (whatever mesh reads them): each split entry gathered from the
  // members, rank 0 writing them.
  CheckpointWriting checkpoint_writing() const override { return CheckpointWriting::whole; }
  // The checkpoint's whole tensors are read and this member's shard taken; where an earlier
  // strategy holds a range of the shard (FSDP's slice), that range of it.
  void share(RankShare& share) const override {
    auto range = std::move(share.range);
    share.range = nullptr;
    // The shape of this member's shard of the parameter of entry `name`.
    auto shard_shape = [this](const std::string& name) -> std::optional<Shape> {
      const PlannedParameter* e = tensor_.planned(name);
      if (!e) return std::nullopt;
      return e->parameter->shape();
    };
    share.whole_shape = [this, range, shard_shape](const std::string& name, const Shape& live) {
      if (range)
        if (const auto r = range(name); r && live == Shape{r->second - r->first})
          if (const std::optional<Shape> shape = shard_shape(name)) return tensor_.whole_shape(name, *shape);
      return tensor_.whole_shape(name, live);
    };
    share.shard_of = [this, range, shard_shape](const std::string& name, const Tensor& whole) {
      const Tensor shard = tensor_.shard(name, whole);
      if (!range) return shard;
      const auto r = range(name);
      const std::optional<Shape> shape = shard_shape(name);
      if (!r || !shape || !(shard.shape() == *shape)) return shard;
      return shard.view(Shape{shard.numel()}).slice(0, r->first, r->second).clone();
    };
  }
  void checkpoint_loaded() override { tensor_.shards_changed(); }
  double take_communication_seconds() override { return tensor_.take_communication_seconds(); }
  // The payload of the model's collectives over the tensor group (activations and their
  // gradients; evaluation's included when it ran).
  void take_metrics(std::vector<std::pair<std::string, double>>& scalars, std::int64_t steps) override {
    const auto per = static_cast<double>(std::max<std::int64_t>(1, steps));
    scalars.emplace_back("throughput/tensor_bytes_per_step", static_cast<double>(tensor_.take_bytes_moved()) / per);
    scalars.emplace_back("throughput/tensor_collectives_per_step",
                         static_cast<double>(tensor_.take_collectives()) / per);
  }

 private:
  TensorParallel& tensor_;
  bool agree_;
};

}  // namespace

Strategies build_strategies(RunComponents& c, World& world, bool overlap_reduce) {
  Strategies strategies;
  FullySharded* fsdp = c.fsdp.get();
  if (fsdp)
    strategies.push_back(std::make_shared<FsdpStrategy>(*fsdp, c.lora != nullptr, *c.model, c.parameters,
                                                        world.fsdp_group(), world.data_group(),
                                                        c.optimizer->elementwise()));
  // Under FSDP the data axis sums the parameters outside the units alone, and FSDP's tape hooks
  // are the tape's.
  const bool reduces = !fsdp || c.parameters.size() > fsdp->trained().size();
  if (c.data_parallel)
    strategies.push_back(std::make_shared<DataAxisStrategy>(*c.data_parallel, overlap_reduce, /*on_tape=*/!fsdp,
                                                            reduces, c.parameters, c.saved_parameters()));
  if (c.tensor) strategies.push_back(std::make_shared<TensorStrategy>(*c.tensor, /*agree=*/!fsdp));
  return strategies;
}

std::optional<Tensor> make_whole(const Strategies& strategies, const std::string& name, const Tensor& t,
                                 const Strategy* done) {
  std::optional<Tensor> out;
  for (const auto& strategy : strategies)
    if (strategy.get() != done)
      if (std::optional<Tensor> w = strategy->whole(name, out ? *out : t)) out = std::move(w);
  return out;
}

CheckpointWriting checkpoint_writing(const Strategies& strategies) {
  CheckpointWriting writing = CheckpointWriting::copy;
  for (const auto& strategy : strategies) {
    const CheckpointWriting says = strategy->checkpoint_writing();
    if (says == CheckpointWriting::whole) return says;
    if (says == CheckpointWriting::parts) writing = says;
  }
  return writing;
}

}  // namespace loom::training
