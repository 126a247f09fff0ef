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
// release() after it. The final weights: where a strategy holds_saved_in_parts(), every rank calls
// gather_model() on each strategy until one gives the model's parameters, then whole() on each
// strategy for each entry, in the model's order; rank 0 writes them.
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

struct RunComponents;

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

  // The final weights (RunComponents::saved_parameters): whether the ranks hold them in parts
  // under this strategy, so that every rank takes part in making them whole.
  virtual bool holds_saved_in_parts() const { return false; }
  // The model's parameters in its order, whole along this strategy's axis, copies on every rank
  // (FSDP's units gathered); nullopt where the model's parameters themselves hold them.
  virtual std::optional<std::vector<std::pair<std::string, Tensor>>> gather_model() { return std::nullopt; }
  // Entry `name` (a parameter's, or an optimizer state's) whose value on this rank is `t`, whole
  // along this strategy's axis; nullopt where `t` is whole already. Every rank calls it for the
  // same entries in the same order.
  virtual std::optional<Tensor> whole(const std::string& /*name*/, const Tensor& /*t*/) { return std::nullopt; }

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
Strategies build_strategies(RunComponents& components, bool overlap_reduce);

}  // namespace loom::training
