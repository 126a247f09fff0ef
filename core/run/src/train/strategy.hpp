// A parallelism strategy: what one way of spreading a run over ranks does to a training step.
//
// The trainer holds a run's strategies in one list, built once from the mesh (build_strategies)
// and iterated by the step; the step names none of them. Data parallelism (gradient buckets, or
// ZeRO-1's optimizer shards), fully sharded data parallelism and tensor parallelism implement it
// today; pipeline and context parallelism, and a collective on a device, plug in here: a new
// strategy is a class below and a line in build_strategies, and the step does not change.
//
// What a strategy is not: the world. Ranks, the agreement on errors and stop signals, the
// broadcasts, the rows of each batch and the mesh's groups belong to the run's World
// (train/world.hpp), which every strategy may use; a strategy adds what it does to the ops, the
// tape and the gradients, through the mechanics of its axis (DataParallel, FullySharded,
// TensorParallel, which the run's components hold).
//
// The contract. Every rank holds the same strategies in the same order and every hook is called
// on every rank at the same point of the step, so a hook may make collective calls, the same
// ones on every rank in the same order whatever this rank's micro-batches reached (a rank that
// skipped one would leave its peers waiting: a deadlock). Each hook runs on the step's thread.
// One step calls, in this order:
//
//   begin_step()                                   after the gradients were zeroed
//   for each of this rank's micro-batches:
//     attach(tape, micro)                          before its forward pass
//     attach(ops)                                  the same Ops runs forward and backward
//     end_micro_batch()                            after its backward pass
//   end_backward()                                 after the last backward, before the loss sum
//   finish_gradients(trained)                      after the loss sum: each gradient is final
//   norm_part(i, p), contribute_to_norm(parts)     the global gradient norm
//   before_update(), after_update()                around the optimizer's update (not on a
//                                                  skipped step)
//
// A forward pass outside training (evaluation, samples) calls attach(ops) on every strategy, and
// release() after it. Swapping the weight average into the trained parameters and back
// (ModelViews::with_average) calls parameters_swapped() on each, in list order, after each swap.
//
// The final weights: where a strategy holds_saved_in_parts(), every rank calls gather_model() on
// each strategy until one gives the model's parameters (whole along its axis), then for each
// entry, in the model's order, whole() on each other strategy in list order (make_whole below);
// rank 0 writes them.
//
// Checkpoints (train/checkpointing.cpp). How the ranks write one is the strategies' say combined
// (checkpoint_writing(Strategies) below): whole where one says whole, else in parts where one
// says parts, else rank 0 writes its copy. At each save, every rank lists the checkpoint's
// entries whole (the saved parameters, the optimizer's state, the weight average) and calls
// hold() on each strategy in list order, which makes them what this rank holds. Then:
//   parts   keep_part() on each strategy in list order leaves this rank's part; every rank writes
//           its part (rank 0 the text files too) and the ranks commit them together.
//   whole   every rank walks the same entries: the saved parameters in their order, then the
//           optimizer's and the average's, in this rank's order, or where a strategy
//           holds_some_entries() the union over the ranks in name order (a broadcast from each
//           rank, in rank order); for each entry, whole() on each strategy in list order, each
//           given what the ones before it made (a rank that holds none of the entry gives the
//           first an undefined tensor); rank 0 writes them.
// Of these hooks only whole() is collective; the others read what this rank holds.
//
// Resume (train/run_setup.cpp), once the model is sharded and the optimizer has its parameters
// (the strategies are built then, before a checkpoint loads): share() on each strategy in list
// order composes what of a checkpoint this rank loads (RankShare, train/resume.hpp), each setting
// what its axis decides; a later strategy's part is what the earlier ones take theirs of (tensor
// parallelism reads whole tensors and takes this member's shard; FSDP's range, set before it, is
// then a range of that shard). Not collective. After the load, checkpoint_loaded() on each in list
// order (collective). Then, unless a strategy holds_different_parameters(), the ranks check that
// they hold the same trained parameters (a collective).
//
// Order. The list holds the strategies in the order a gradient is finished: FSDP's units first,
// then the data axis (its buckets, or ZeRO-1's reduce-scatter), then the tensor axis, whose sums
// of replicated parameters' partial gradients and whose agreement on what a member reached come
// after the data axis's. begin_step, attach, end_micro_batch, end_backward, finish_gradients and
// the metrics run in the list's order; norm_part, contribute_to_norm, before_update and
// after_update in the reverse (a tensor shard's squares are summed over its members before the
// data or fsdp axis sums them; the tensor axis's whole copies take their update and give each
// member its shard before ZeRO-1 gathers the ranks' shards). These orders are the trainer's
// bits: a strategy that changed them would change every sum's rounding.
//
// Bits. With one rank every hook is the identity, and a run's result does not depend on which
// strategies are listed where they have nothing to do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/model.hpp"

namespace loom::training {

class World;
struct RunComponents;
struct CheckpointEntries;  // train/checkpointing.hpp
struct RankShare;          // train/resume.hpp
struct RunHeader;          // train/progress.hpp

// How the ranks write a checkpoint (Strategy::checkpoint_writing).
enum class CheckpointWriting {
  copy,   // every rank holds what rank 0 holds: rank 0 writes its own, one process's files
  parts,  // the ranks hold different entries, or ranges of them: each writes its part (rank files)
  whole,  // each entry is made whole (Strategy::whole, every rank taking part): rank 0 writes them
};

// A micro-batch's tape, as a strategy sees it.
struct MicroBatchTape {
  // This rank's last micro-batch of the step: the gradients backward produces are final.
  bool last = false;
  // Completes `p`'s gradient with the earlier micro-batches' sum (the step sets those aside and
  // adds them back, in micro-batch order); null on the first micro-batch. A strategy that reads a
  // gradient during backward calls it first.
  const std::function<void(Parameter&)>* complete = nullptr;
};

// The squares of the gradient norm, by how the ranks hold them.
enum class NormPart {
  local,       // this rank's own: the strategies sum them over the ranks that hold different parts
  split,       // a tensor-parallel shard's: summed over the tensor group's members
  replicated,  // the same on every rank (a strategy's replicas): counted once, never summed
};
struct NormParts {
  double local = 0, split = 0, replicated = 0;
};

class Strategy {
 public:
  virtual ~Strategy() = default;
  Strategy() = default;
  Strategy(const Strategy&) = delete;
  Strategy& operator=(const Strategy&) = delete;

  // Whether the strategy sums the micro-batches' gradients itself (into its shards, as they are
  // reduced). When none does, the step sets each micro-batch's gradients aside and adds them in
  // order, so the sum is ((g0 + g1) + g2) + ... on every rank.
  virtual bool sums_micro_batches() const { return false; }

  virtual void begin_step() {}
  // Before a training micro-batch's forward pass: hooks on its tape (what a strategy needs done
  // when backward needs a parameter or produced a gradient). At most one strategy sets each of
  // the tape's callbacks.
  virtual void attach(Tape&, const MicroBatchTape&) {}
  // Every Ops that runs the model, in training, evaluation or sampling.
  virtual void attach(Ops&) {}
  virtual void end_micro_batch() {}
  // After this rank's last backward pass: every collective the gradients need is posted now,
  // before the step's next collective (the loss sum).
  virtual void end_backward() {}
  // The gradients of `trained` (the optimizer's parameters), made final: summed over the ranks
  // that computed parts of them, marked where only another rank's micro-batches reached them.
  virtual void finish_gradients(const std::vector<ModelParameter>&) {}

  // Which part of the norm the squares of `trained[index]` (`p`) count in, where this strategy
  // decides it; the first strategy (in norm order) that does decides. Default: local.
  virtual std::optional<NormPart> norm_part(std::size_t /*index*/, const Parameter& /*p*/) const {
    return std::nullopt;
  }
  // Sums its part of the squares over the ranks that hold different parts of them.
  virtual void contribute_to_norm(NormParts&) {}

  // Around the optimizer's update.
  virtual void before_update() {}
  virtual void after_update() {}

  // After a forward pass outside training (an evaluation, samples): what it gathered is freed.
  virtual void release() {}
  // Whether every rank runs the model's forward passes together, evaluation's included (FSDP
  // gathers its units, tensor parallelism's members compute their parts): the strategy's name, for
  // the notes about what does not run under it yet; null where each rank runs the model alone.
  virtual const char* runs_model_together() const { return nullptr; }
  // Whether samples are drawn under it: false where they are not yet (FSDP), true where every rank
  // draws them together (tensor parallelism's members, through the model's parts); nullopt where
  // it has no say (rank 0 draws them). The first strategy that says decides.
  virtual std::optional<bool> draws_samples() const { return std::nullopt; }

  // After the trained parameters' values were swapped from outside the step (the weight average
  // in or out): what the strategy derives from them follows. Every rank calls it.
  virtual void parameters_swapped() {}

  // The final weights (RunComponents::saved_parameters): whether the ranks hold them in parts
  // under this strategy, so that every rank takes part in making them whole.
  virtual bool holds_saved_in_parts() const { return false; }
  // The model's parameters in its order, whole along this strategy's axis, copies on every rank
  // (FSDP's units gathered); nullopt where the model's parameters themselves hold them.
  virtual std::optional<std::vector<std::pair<std::string, Tensor>>> gather_model() { return std::nullopt; }
  // Entry `name` (a parameter's, or an optimizer state's or the weight average's "slot/parameter")
  // whose value on this rank is `t` as the strategies before this one in the list made it (this
  // rank's own as hold() gave it, first; undefined where this rank holds none of it), whole along
  // this strategy's axis; nullopt where it is whole along it already (or not this strategy's).
  // Collective where the strategy holds the entry in parts: every rank calls it for the same
  // entries in the same order.
  virtual std::optional<Tensor> whole(const std::string& /*name*/, const Tensor& /*t*/) { return std::nullopt; }

  // Checkpoints (the contract above). How the ranks write them under this strategy.
  virtual CheckpointWriting checkpoint_writing() const { return CheckpointWriting::copy; }
  // The entries as this rank holds them (a slice is a checkpoint::Entry of a range of elements).
  virtual void hold(CheckpointEntries&) const {}
  // In a checkpoint of parts: which of the entries it holds this rank writes.
  virtual void keep_part(CheckpointEntries&) const {}
  // Whether a rank may hold none of an entry that another rank holds (no slice of a parameter,
  // so none of its optimizer state).
  virtual bool holds_some_entries() const { return false; }

  // Resume (the contract above): its part of what of a checkpoint's entries this rank loads.
  virtual void share(RankShare&) const {}
  // After a checkpoint loaded into what share() named: what the strategy derives from it follows
  // (whole copies taken from the shards). Every rank calls it.
  virtual void checkpoint_loaded() {}
  // Whether the ranks hold different values of the trained parameters once they are loaded (FSDP's
  // slices: it checks the ranks' weights before it shards them), so that they are not compared.
  virtual bool holds_different_parameters() const { return false; }

  // Its part of the run's header (what a rank holds under it), once the run is set up.
  virtual void describe(RunHeader&) const {}

  // Seconds spent waiting on the strategy's collectives since the last call.
  virtual double take_communication_seconds() { return 0; }
  // Its scalars for the log line (throughput/...), per step over the `steps` since the last call.
  virtual void take_metrics(std::vector<std::pair<std::string, double>>& /*scalars*/, std::int64_t /*steps*/) {}
};

using Strategies = std::vector<std::shared_ptr<Strategy>>;

// The strategies of `components` (after the model is sharded: components' fsdp and tensor are
// set where the mesh has those axes, and data_parallel where the run sums gradients over its data
// axis), in the order above. `overlap_reduce`: the data axis reduces its gradient buckets during
// the last micro-batch's backward pass.
Strategies build_strategies(RunComponents& components, World& world, bool overlap_reduce);

// `t`, entry `name` as this rank holds it (undefined: none of it), made whole along the axis of
// every strategy but `done` (one whose axis it is whole along already), in list order; nullopt
// where no strategy changed it. Every rank calls it for the same entries in the same order.
std::optional<Tensor> make_whole(const Strategies& strategies, const std::string& name, const Tensor& t,
                                 const Strategy* done = nullptr);

// How the ranks write a checkpoint under `strategies`: whole where one says whole, else in parts
// where one says parts, else copy.
CheckpointWriting checkpoint_writing(const Strategies& strategies);

}  // namespace loom::training
