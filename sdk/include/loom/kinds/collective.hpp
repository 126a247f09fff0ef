// The `collective` kind: communication between the processes of one run.
//
// A run has exactly one collective. `single` (one process, every operation the identity) is the
// default; `mpi` (OpenMPI) is picked by the run layer when the process was started by mpirun.
// The core never links MPI: it is this plugin kind that does.
//
// The Collective is the group of every rank (the world). Its split() makes groups of some of
// them, which have every operation of the world (CollectiveGroup); group() is the group of the
// ranks along one axis of the run's mesh (sdk/include/loom/mesh.hpp): the data-parallel replicas,
// or the ranks that shard one parameter.
//
// The contract, for the world and for every group alike:
// - Every member calls the same operations in the same order with buffers of the same sizes; an
//   operation returns when this rank's part is complete. Operations of different groups may
//   interleave, but two ranks that take part in the same two operations call them in the same
//   order (as they do when every rank runs the same step code): an implementation may run them
//   one after the other.
// - Results are identical on every member (all_reduce and all_gather hand every member the same
//   bytes). The order of a reduction is fixed by the group's size alone: the same inputs give the
//   same bits on every member, in every group of that size, and on every run.
// - Calls come from the thread running the step; start_all_reduce() returns at once and its
//   Pending is waited for on that thread too.
// - A failed operation, or a peer that died, is a loom::Error naming the operation and the rank,
//   never a hang: implementations make sure a lost peer ends the operation within seconds.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "loom/component.hpp"
#include "loom/device.hpp"
#include "loom/mesh.hpp"

namespace loom {

enum class ReduceOp { sum, max, min };

// Some ranks of a run that communicate among themselves. Ranks, roots and chunk orders below are
// the members' ranks in the group, [0, size()).
class CollectiveGroup {
 public:
  virtual ~CollectiveGroup();

  // This process's rank in the group, in [0, size()), and the number of members.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Combines `data` element-wise over the members, in place.
  virtual void all_reduce(std::span<float> data, ReduceOp op = ReduceOp::sum) = 0;
  // The same over doubles (losses, token counts, checksums: where float32 would round).
  virtual void all_reduce(std::span<double> data, ReduceOp op = ReduceOp::sum) = 0;

  // in.size() == out.size() * size(). Member r receives the sum over members of chunk r of `in`
  // (elements [r * out.size(), (r + 1) * out.size())). `out` may be that chunk of `in` itself
  // (in place); otherwise the two do not overlap. Implementations take memory of their own that
  // does not grow with the buffer (a ZeRO-1 run reduces all its gradients at once), here and in
  // all_reduce.
  virtual void reduce_scatter(std::span<const float> in, std::span<float> out) = 0;
  // out.size() == in.size() * size(). Every member receives every member's `in`, in rank order.
  // `in` may be this member's chunk of `out` itself (in place); otherwise the two do not overlap.
  virtual void all_gather(std::span<const float> in, std::span<float> out) = 0;

  // Member `root`'s bytes, copied into every member's `data` (same size everywhere).
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  virtual void barrier() = 0;

  // An all-reduce (sum) under way. wait() returns when `data` holds the result; the buffer must
  // not be touched or freed before. Destroying a Pending that was not waited for waits.
  class Pending {
   public:
    virtual ~Pending();
    virtual void wait() = 0;
  };
  // Starts an all-reduce (sum) of `data` that proceeds while the caller computes (gradient
  // buckets during the backward pass). Pendings complete in the order they were started; the
  // result equals all_reduce(data) bit for bit.
  virtual std::unique_ptr<Pending> start_all_reduce(std::span<float> data) = 0;
  // all_gather and reduce_scatter under way, with the same rules for their buffers as
  // start_all_reduce's (untouched until wait()) and the same order among all started operations;
  // results equal the blocking ones' bit for bit. Fully sharded data parallelism gathers the next
  // unit's weights, and reduces the last unit's gradients, while the current unit computes. The
  // defaults run the blocking operation at once (correct, without overlap).
  virtual std::unique_ptr<Pending> start_all_gather(std::span<const float> in, std::span<float> out);
  virtual std::unique_ptr<Pending> start_reduce_scatter(std::span<const float> in, std::span<float> out);

  // Whether the operations take buffers in memory of buffer type `type` (device.hpp: pointers as
  // Tensor::device_data gives them). The host's memory always; a device's when the transport
  // reads and writes it itself (CUDA-aware MPI, NCCL), which such a collective declares by
  // overriding this. A caller whose tensors are in memory the collective cannot send from stages
  // them through host memory, with explicit copies (the trainer does, and says so in its header).
  virtual bool can_send_from(const BufferType& type) const { return type.host_visible(); }
};

class Collective : public Component, public CollectiveGroup {
 public:
  static constexpr std::string_view kind = "collective";
  ~Collective() override;

  // rank() and size() are this process's rank in the run and the number of processes.

  // What carries the traffic, for the run's log ("OpenMPI 4.1.4, 2 ranks on 1 host").
  virtual std::string describe() const = 0;

  // Splits the world into groups (MPI_Comm_split): the ranks that pass the same `color` (>= 0)
  // form one group, their ranks in it ordered by `key` (ties by world rank). A collective
  // operation of the world: every rank calls it, in the same order relative to the others.
  //
  // Ownership and lifetime: the caller owns the group; it may be shared, and it must be released
  // before the Collective that made it (its code lives in the collective's plugin). Releasing it
  // is local (no peer waits for it). Its operations follow the contract above, on the thread
  // that runs the step; a group stays valid however many others are made.
  virtual std::shared_ptr<CollectiveGroup> split(int color, int key) = 0;

  // The group along `axis` of `mesh` through this rank: its members ordered by their coordinate
  // on the axis (split(mesh.group_index(rank(), axis), mesh.coordinate(rank(), axis))). Every rank
  // calls it. An InternalError when mesh.world_size() is not size().
  std::shared_ptr<CollectiveGroup> group(const Mesh& mesh, MeshAxis axis);
};

}  // namespace loom
