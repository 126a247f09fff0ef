// Fully sharded data parallelism (ZeRO-3, trainer.mesh's fsdp axis): along the fsdp axis each
// rank holds 1/F of every sharding unit's parameters, of their gradients and of the optimizer
// state; a unit's weights are gathered when the forward pass first takes one of them and freed
// after it, gathered again for its backward pass, and its gradients reduce-scattered as soon as
// they are final. See docs/distributed.md ("Fully sharded data parallelism").
//
// Layout. A unit (Model::sharding_units) is its parameters one after another, each starting on a
// 16-float boundary, padded to F chunks of `chunk` floats: rank f of the axis owns elements
// [f * chunk, (f + 1) * chunk) of the unit, so it holds at most one contiguous range of each
// parameter's flat elements. The model's parameters become views into the unit's storage, which
// holds memory only while the unit is gathered (core/storage.hpp); the tape's saved references to
// them stay valid across a free and a gather.
//
// The optimizer. An elementwise optimizer (Optimizer::elementwise: AdamW, SGD, Lion) updates
// this rank's slices of the parameters as parameters of their own ("pieces", named as the model's
// parameters, of the slice's length). Any other (Muon, SOAP, Adafactor) needs whole matrices:
// each trained parameter is owned whole by one rank of the axis (balanced by size), its gradient
// summed whole (an all-reduce of the unit instead of a reduce-scatter), the owner updates it, and
// the units' shards are refreshed from the owners after the step.
//
// Collective order: every rank gathers, reduces and frees the same units in the same order, as
// the forward and backward passes of the same model take them; prefetches follow the order the
// first micro-batch recorded. Every operation runs on the step's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

struct FsdpSettings {
  bool reshard_after_forward = true;  // trainer.fsdp.reshard_after_forward
  bool prefetch = true;               // trainer.fsdp.prefetch
  bool elementwise_optimizer = true;  // Optimizer::elementwise()
  // Where the ranks agree on which trained parameters any micro-batch reached: `world` when null.
  // Under tensor parallelism, every rank (a tensor group's members hold units of the same
  // parameters, and one may reach a parameter its peers do not: a mixture's experts).
  CollectiveGroup* reached_group = nullptr;
};

// One rank's slice of one parameter, for checkpoints: elements [begin, end) of its flat value.
struct ParameterSlice {
  Parameter* model = nullptr;  // the model's parameter (its name, its global shape)
  Parameter* piece = nullptr;  // the slice as a parameter of its own: [end - begin]
  std::int64_t begin = 0, end = 0;
};

class FullySharded {
 public:
  // Moves the model's parameters into units (the model's own parameter memory is given back)
  // and keeps this rank's shard of each. `world` sums what every rank computed; `fsdp` is the
  // group along the fsdp axis, `data` the one along the data axis (replicas of the same shard).
  // `trained`: the model's parameters that train (the others are frozen: sharded too, never
  // reduced). Every rank calls it at the same point.
  FullySharded(CollectiveGroup& world, std::shared_ptr<CollectiveGroup> fsdp, std::shared_ptr<CollectiveGroup> data,
               Model& model, const std::vector<ModelParameter>& trained, const FsdpSettings& settings);
  ~FullySharded();
  FullySharded(const FullySharded&) = delete;
  FullySharded& operator=(const FullySharded&) = delete;

  // What this rank's optimizer, gradient norm, clipping and weight average work on: its pieces of
  // the trained parameters (elementwise optimizer) or the trained parameters it owns, whole.
  const std::vector<ModelParameter>& trained() const { return trained_; }
  // Every parameter's slice on this rank (frozen ones too), in the model's parameter order.
  const std::vector<ParameterSlice>& slices() const { return slices_; }
  int shards() const { return fsdp_->size(); }
  const FsdpSettings& settings() const { return settings_; }
  std::size_t num_units() const { return units_.size(); }
  // The largest unit, gathered, in bytes (for the memory estimate's gathered units).
  std::int64_t largest_unit_bytes() const;

  // Before the step's first micro-batch: the shard gradients start afresh.
  void begin_step();
  // Gathers a unit when an operation of `ops` first takes one of its parameters (forward passes:
  // training, evaluation, samples). Each rank must run the same forward passes.
  void attach(Ops& ops);
  // The backward hooks of a training micro-batch's tape: units gathered again before their
  // backward pass, gradients reduced when final. Call before the forward pass.
  void attach(Tape& tape);
  // After the micro-batch's backward pass: its reductions finish, every unit is freed.
  void end_micro_batch();
  // After the step's last micro-batch: which trained parameters any rank's micro-batches reached
  // (those get the summed gradient, the others none, as on one process).
  void finish_gradients();
  // The sum over the shards (not the replicas) of a per-rank figure: the squared gradient norm.
  double sum_over_shards(double value);
  // After the optimizer's update (or a swap of the weight average into the parameters it
  // updates): whole-matrix optimizers' owners hand every rank its shard. Every rank calls it.
  void owners_changed();
  // After the shards were written from outside (a checkpoint loaded into slices()): whole-matrix
  // optimizers' owners take their whole copies from the shards. Every rank calls it.
  void shards_changed();
  // Frees every gathered unit (after an evaluation or samples).
  void release();
  // The whole value of every parameter, in the model's order (every rank calls it; the result is
  // complete on every rank). For the final weights.
  std::vector<std::pair<std::string, Tensor>> gather_full();
  // Seconds spent waiting on gathers and reductions since the last call; the bytes this rank's
  // gathers and reductions handled since the last call (each unit's whole size per operation).
  double take_communication_seconds();
  std::int64_t take_bytes_moved();

 private:
  struct Member {
    Parameter* parameter = nullptr;
    std::int64_t offset = 0;  // in the unit
    std::int64_t numel = 0;
    bool trained = false;
    std::uint64_t used_stamp = 0;  // the micro-batch that last took it
    bool had_grad = false;         // this step, on this rank
    int owner = 0;                 // whole-matrix optimizers: the rank that updates it
    Parameter* piece = nullptr;    // its slice on this rank, if any
    Parameter* whole = nullptr;    // on the owner: its whole copy
    Tensor whole_grad;             // and its gradient buffer
  };
  struct Unit {
    std::string name;
    std::vector<Member> members;
    std::int64_t chunk = 0;  // floats per rank
    Tensor home;             // [shards * chunk]: the parameters' values, memory only while gathered
    Tensor grad_home;        // [shards * chunk]: their gradients, memory only during the backward pass
    Tensor shard;            // [chunk]: this rank's values
    Tensor shard_grad;       // [chunk]: their gradient, summed over the ranks and the micro-batches
    bool gathered = false, grad_live = false, grad_started = false;
    std::unique_ptr<CollectiveGroup::Pending> gathering;
    std::vector<std::unique_ptr<CollectiveGroup::Pending>> reducing;  // in order; the last ends last
    Tensor scratch;                             // data x fsdp: the gradients in world-slice order, while reducing
    int used = 0, used_trained = 0, ready = 0;  // members this micro-batch took, trained ones, done
  };

  Unit& unit_of(Parameter& p);
  void use_forward(Parameter& p);
  void needed(Parameter& p, bool values);
  void gradient_ready(Parameter& p);
  void gather(std::size_t u, bool wait);
  void wait_gather(Unit& unit);
  void free_values(std::size_t u);
  void ensure_grad(Unit& unit);
  void start_reduce(std::size_t u);
  void finish_reduce(std::size_t u);
  void prefetch_after(std::vector<std::size_t>& sequence, std::size_t& position, std::size_t u, bool recording);
  void note_use(Unit& unit, Member& m);

  CollectiveGroup& world_;
  std::shared_ptr<CollectiveGroup> fsdp_, data_;
  FsdpSettings settings_;
  std::vector<Unit> units_;
  std::unordered_map<const Parameter*, std::pair<std::size_t, std::size_t>> where_;  // unit, member
  std::deque<Parameter> pieces_;                                                     // stable addresses
  std::vector<ModelParameter> trained_;
  std::vector<ParameterSlice> slices_;
  std::vector<Parameter*> order_;      // the model's parameters, in its order
  std::vector<std::size_t> reducing_;  // units whose reduction is under way, in start order
  bool in_backward_ = false;
  std::size_t current_ = static_cast<std::size_t>(-1);
  std::uint64_t micro_stamp_ = 0;
  std::vector<std::size_t> forward_order_, backward_order_;
  std::size_t forward_at_ = 0, backward_at_ = 0;
  bool orders_recorded_ = false;
  double communication_seconds_ = 0;
  std::vector<float> flags_;  // finish_gradients(): which trained parameters any rank reached
  std::int64_t bytes_moved_ = 0;
};

}  // namespace loom::training
