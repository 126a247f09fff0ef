#include "train/strategy.hpp"

#include <algorithm>

#include "train/components.hpp"

namespace loom::training {

namespace {

// Fully sharded data parallelism: the model's trained parameters in sharded units, gathered for
// each pass and reduce-scattered as their gradients are final (train/fsdp.hpp).
class FsdpStrategy final : public Strategy {
 public:
  // `adapters_saved`: the final weights are LoRA's adapters, outside the units (held whole).
  FsdpStrategy(FullySharded& fsdp, bool adapters_saved) : fsdp_(fsdp), adapters_saved_(adapters_saved) {}

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
  bool holds_saved_in_parts() const override { return !adapters_saved_; }
  std::optional<std::vector<std::pair<std::string, Tensor>>> gather_model() override {
    if (adapters_saved_) return std::nullopt;
    return fsdp_.gather_full();
  }
  double take_communication_seconds() override { return fsdp_.take_communication_seconds(); }
  // The bytes this rank's gathers and reductions moved per step since the last line.
  void take_metrics(std::vector<std::pair<std::string, double>>& scalars, std::int64_t steps) override {
    scalars.emplace_back("throughput/fsdp_bytes_per_step", static_cast<double>(fsdp_.take_bytes_moved()) /
                                                               static_cast<double>(std::max<std::int64_t>(1, steps)));
  }

 private:
  FullySharded& fsdp_;
  bool adapters_saved_;
};

// The data axis: the gradients of the parameters every rank of it holds whole, summed in buckets
// (during the last micro-batch's backward pass when overlapped), or ZeRO-1's shards: reduce-
// scattered, each rank updating its shard, the updated weights gathered (train/data_parallel.hpp).
// Under FSDP it carries the parameters outside the units (LoRA's adapters), where there are any.
class DataAxisStrategy final : public Strategy {
 public:
  DataAxisStrategy(DataParallel& data, bool overlap_reduce, bool on_tape, bool reduces)
      : data_(data), overlap_(overlap_reduce && data.world().size() > 1 && on_tape), reduces_(reduces) {}

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
  double take_communication_seconds() override { return data_.take_communication_seconds(); }

 private:
  DataParallel& data_;
  bool overlap_;
  bool reduces_;
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

Strategies build_strategies(RunComponents& c, bool overlap_reduce) {
  Strategies strategies;
  FullySharded* fsdp = c.fsdp.get();
  if (fsdp) strategies.push_back(std::make_shared<FsdpStrategy>(*fsdp, c.lora != nullptr));
  // Under FSDP the data axis sums the parameters outside the units alone, and FSDP's tape hooks
  // are the tape's.
  const bool reduces = !fsdp || c.parameters.size() > fsdp->trained().size();
  if (c.data_parallel)
    strategies.push_back(
        std::make_shared<DataAxisStrategy>(*c.data_parallel, overlap_reduce, /*on_tape=*/!fsdp, reduces));
  if (c.tensor) strategies.push_back(std::make_shared<TensorStrategy>(*c.tensor, /*agree=*/!fsdp));
  return strategies;
}

}  // namespace loom::training
