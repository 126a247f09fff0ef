// Data parallelism, the data axis of the mesh: the ranks along it each take their rows of every
// global batch (World::first_row), and their gradients are summed so that every rank applies the
// same update. Either in flat buckets (PyTorch DDP's), each reduced as soon as backward has
// finished it in the last micro-batch (trainer.overlap_grad_reduce), or ZeRO-1
// (trainer.shard_optimizer_state): each rank keeps the optimizer state of one contiguous shard of
// the parameters, the gradients are reduce-scattered and the updated shards gathered. Gradient
// storage in a device's memory that the collective cannot send from is staged through host
// memory. Under FSDP it sums the gradients of the parameters outside FSDP's units (LoRA's
// adapters).
//
// The contract. It lives on the run's World (train/world.hpp), which gives it the ranks and the
// data and replica groups; the ranks, the agreement on errors and the mesh are the world's, not
// its. attach() or shard() is called once, before the first step, on every rank.
// start_remaining_buckets, reduce_gradients and gather_parameters are collective (every rank, at
// the same point of the step: DataAxisStrategy in train/strategy.cpp calls them); gradient_ready
// may start a bucket's reduction early, in the buckets' order, and start_remaining_buckets posts
// the rest, so every rank posts the same reductions in the same order whatever its micro-batches
// reached. With one rank every operation here is the identity and costs nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "loom/autograd.hpp"
#include "loom/kinds/backend.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"
#include "loom/tensor.hpp"
#include "train/world.hpp"

namespace loom::training {

class DataParallel {
 public:
  // On `world`'s data axis (after World::set_mesh; `world` outlives it).
  explicit DataParallel(World& world);
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  World& world() { return world_; }

  // Gives the parameters gradient storage in flat buckets of about `bucket_bytes`
  // (trainer.grad_bucket_mb), in the order backward produces them, so that reduce_gradients()
  // reduces in place. Call once, before the first step.
  void attach(const std::vector<ModelParameter>& parameters, std::int64_t bucket_bytes);
  // ZeRO-1 instead (trainer.shard_optimizer_state): the parameters are split into one
  // contiguous shard per rank, of about equal size; this rank's optimizer holds the state of its
  // shard only. Gradients are reduce-scattered (each rank receives the sum of its shard), the rank
  // updates its shard, and gather_parameters() hands every rank the updated weights.
  void shard(const std::vector<ModelParameter>& parameters);
  bool sharded() const { return sharded_; }
  // Whether this rank's optimizer updates `p` (every parameter unless sharded).
  bool owns(const Parameter* p) const { return !sharded_ || owned_.contains(p); }
  // The rank that writes `p` (its weights, its optimizer state and its weight average) into a
  // checkpoint of parts: its ZeRO-1 owner; rank 0 for a parameter that no rank updates.
  int checkpoint_writer_of(const Parameter* p) const {
    const auto it = owner_.find(p);
    return it == owner_.end() ? 0 : it->second;
  }
  // After this rank's update of its shard: every rank's shard, to every rank.
  void gather_parameters();
  // During the backward pass of this rank's last micro-batch: `p`'s gradient is final. A bucket
  // whose parameters are all final starts reducing at once, while backward goes on (buckets
  // start in their order, the same on every rank).
  void gradient_ready(Parameter& p);
  // After this rank's last backward pass, before the step's next collective: starts, in order,
  // the buckets that backward did not (a parameter this rank's last micro-batch did not reach: an
  // expert that got no token here, or one only an earlier micro-batch reached), its unreached
  // parameters contributing zeros. So every rank has posted all its bucket reductions before the
  // loss sum whatever its micro-batches reached, and the ranks' collectives stay in one order
  // (a rank that posted them later than its peers would wait in the loss sum while they wait in
  // the reduction: a deadlock).
  void start_remaining_buckets();
  // Sums every gradient over the ranks (and marks those that only another rank's micro-batches
  // reached): starts the buckets not started yet and waits for all of them.
  void reduce_gradients();
  // Seconds spent in reduce_gradients() since the last call (for the throughput metrics).
  double take_communication_seconds();
  // The backend whose memory the gradient buckets are in: it zero-fills a bucket's part that no
  // micro-batch reached when the host cannot write it. Before attach() or shard().
  void set_backend(Backend& backend) { backend_ = &backend; }
  // Whether the gradients are staged through host memory: their buckets are in a device's memory
  // (the backend's) that the collective cannot send from (CollectiveGroup::can_send_from). Each
  // bucket then goes to a host copy of itself and back, two explicit copies per bucket and step
  // (ZeRO-1: two for the reduce-scatter, two for the gather). After attach() or shard().
  bool staged() const { return staged_; }
  // The header's line saying so, or "" when nothing is staged.
  std::string staging_note() const;

 private:
  struct Bucket {
    Tensor storage;                                               // flat f32 on the parameters' device
    Tensor host;                                                  // staged: its copy in host memory
    std::vector<std::pair<Parameter*, std::int64_t>> parameters;  // with their offsets
    std::size_t ready = 0;                                        // parameters whose gradient is final, this step
  };
  void start_ready_buckets();
  // Zeroes elements [offset, offset + n) of the f32 `buffer`: on the host, or by the backend.
  void zero(const Tensor& buffer, std::int64_t offset, std::int64_t n);
  World& world_;
  // The ranks that sum their gradients: the world's data axis.
  std::shared_ptr<CollectiveGroup> data_group_;
  // Where the buckets' gradients (parameters every rank holds whole) are summed: the data axis,
  // which is every rank without an fsdp axis; with one, every rank (LoRA's adapters beside FSDP's
  // units).
  CollectiveGroup& replicated_group() { return world_.fully_sharded() ? world_.replica_group() : *data_group_; }
  int rank_ = 0, size_ = 1;  // the world's
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, std::size_t> bucket_of_;
  std::size_t started_ = 0;  // buckets_[0..started_) are under way
  std::vector<std::unique_ptr<CollectiveGroup::Pending>> pending_;
  std::vector<Parameter*> parameters_;
  // ZeRO-1: one flat gradient buffer of a segment per rank of segment_ floats, rank r's parameters
  // in segment r; (parameter, offset in the buffer, rank) for each. The gradients are
  // reduce-scattered in it and the updated weights all-gathered through it, both in place.
  bool sharded_ = false;
  std::int64_t segment_ = 0;
  Tensor flat_grads_;
  Tensor host_flat_;     // staged ZeRO-1: flat_grads_' copy in host memory
  bool staged_ = false;  // see staged()
  // Decides staged_ for buffers on `device` and the group that sums them.
  void decide_staging(const Device& device, const CollectiveGroup& group);
  Backend* backend_ = nullptr;
  std::vector<std::tuple<Parameter*, std::int64_t, int>> layout_;
  std::unordered_set<const Parameter*> owned_;
  std::unordered_map<const Parameter*, int> owner_;
  void reduce_scatter_gradients();
  std::vector<float> has_grad_;
  double communication_seconds_ = 0;
};

}  // namespace loom::training
