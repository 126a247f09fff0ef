// Tensor parallelism's runtime (trainer.mesh's tensor axis): the model's parallel plan
// (Model::parallel_plan, sdk/include/loom/parallel_plan.hpp) read by the trainer. The model
// allocated its shards and communicates inside its forward pass through the Ops' tensor group;
// this class sums the partial gradients of replicated parameters, counts the split shards' squares
// once in the gradient norm, and turns shards into whole tensors for checkpoints (and back), so a
// checkpoint written under any tensor size resumes under any other.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

class TensorParallel {
 public:
  // `plan` covers every parameter of `model` (a UserError naming the model otherwise, and when it
  // has no plan).
  TensorParallel(std::shared_ptr<CollectiveGroup> group, Model& model, std::string model_name);

  CollectiveGroup& group() const { return *group_; }
  int size() const { return group_->size(); }
  int rank() const { return group_->rank(); }
  // The Ops's tensor group: the group itself, through a counter of what it moves.
  void attach(Ops& ops) const { ops.set_tensor_group(counted_.get()); }
  // The payload of the operations' collectives over the group since the last call (elements x 4
  // bytes of each all-reduce, all-gather output and reduce-scatter input), and their number.
  std::int64_t take_bytes_moved();
  std::int64_t take_collectives();
  // Seconds spent in them since the last call (waiting for the other members included).
  double take_communication_seconds();

  // The plan's entry for a parameter (by pointer), or null for one outside the plan (LoRA's
  // adapters, which are not split).
  const PlannedParameter* planned(const Parameter* p) const;
  bool is_split(const Parameter* p) const {
    const PlannedParameter* e = planned(p);
    return e && e->placement.is_split();
  }
  // The same by parameter name, for checkpoint entries ("exp_avg/layers.0.mlp.up_proj.weight").
  const PlannedParameter* planned(const std::string& entry) const;
  // `piece` (fully sharded data parallelism's slice of `model`'s shard) stands for `model` in
  // planned(): its gradient is summed and counted as the model parameter's.
  void alias(const Parameter* piece, const Parameter* model);

  // After the data axis's reduction: the gradients of replicated_partial parameters summed over
  // the group. Every member calls it at the same point.
  void reduce_partial_gradients(const std::vector<ModelParameter>& trained);
  // After the data axis's reduction (DataParallel::reduce_gradients, which leaves zeros in the
  // gradient buffer of a parameter no micro-batch of its replicas reached): a split parameter that
  // another member reached gets its zeros marked as its gradient, as one process's whole
  // parameter has zero rows where nothing reached it (a mixture's experts that got no token on
  // this member). Every member calls it at the same point.
  void agree_on_gradients(const std::vector<ModelParameter>& trained);
  // A sum of squares over the split shards, summed over the members.
  double sum_over_members(double value) const;

  // The whole tensor of checkpoint entry `entry` whose live (shard) tensor is `live`: gathered
  // from the members for a split parameter's entry, `live` itself otherwise. Every member calls
  // it for the same entries in the same order.
  Tensor whole(const std::string& entry, const Tensor& live) const;
  // The whole shape of entry `entry` whose live tensor is `live`.
  Shape whole_shape(const std::string& entry, const Shape& live) const;
  // This member's shard of the whole tensor of entry `entry`.
  Tensor shard(const std::string& entry, const Tensor& whole) const;

  // Whole-matrix optimizers (Muon, SOAP, Adafactor: Optimizer::elementwise() false) update every
  // split parameter through a whole copy, the same on every member: whole_copy() makes it (from the
  // members' shards; every member calls it for the same parameters in the same order) and returns
  // what the optimizer is given instead of the shard; before each update the shards' gradients
  // are gathered into the copies, after it each member takes its shard of the updated copy.
  // (Correct and simple; each member then holds and updates every split matrix whole.)
  Parameter* whole_copy(Parameter* shard);
  void before_update();
  void after_update();
  // After the shards were written from outside (a checkpoint loaded): the copies follow.
  void shards_changed();
  bool has_whole_copies() const { return !copies_.empty(); }
  // Whether entry `entry` (an optimizer state entry) belongs to a whole copy: held whole, the same
  // on every member, not split.
  bool held_whole(const std::string& entry) const;

  // "tensor 2: 26 of 30 parameters split (heads, width, vocabulary), 3.1 MiB of weights per rank"
  std::string describe() const;

 private:
  std::shared_ptr<CollectiveGroup> group_;
  std::shared_ptr<CollectiveGroup> counted_;  // group_ behind a counter
  std::string model_name_;
  std::vector<PlannedParameter> plan_;
  std::unordered_map<const Parameter*, std::size_t> index_;  // the model's parameters and their aliases
  std::unordered_map<std::string, std::size_t> by_name_;
  struct Copy {
    Parameter* shard;
    Parameter* whole;
    Tensor grad;
  };
  // The whole tensor of `e` from this member's `shard` and the others', into `out` (e.whole).
  void gather_into(const PlannedParameter& e, const Tensor& shard, const Tensor& out) const;
  mutable std::vector<float> mine_, all_;  // gather_into's buffers, kept across steps

  std::deque<Parameter> copy_storage_;  // stable addresses
  std::vector<Copy> copies_;
  std::unordered_set<std::string> copied_names_;
};

}  // namespace loom::training
