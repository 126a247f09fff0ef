// The `collective` kind: communication between the processes of one data-parallel run.
//
// A run has exactly one collective. `single` (one process, every operation the identity) is the
// default; `mpi` (OpenMPI) is picked by the run layer when the process was started by mpirun.
// The core never links MPI: it is this plugin kind that does.
//
// Every rank calls the same operations in the same order with buffers of the same sizes; a
// collective returns when this rank's part is complete. Results are identical on every rank
// (all_reduce and all_gather hand every rank the same bytes). Calls come from the thread running
// the step; start_all_reduce() returns at once and its Pending is waited for on that thread too.
// A failed operation, or a peer that died, is a loom::Error naming the operation and the rank,
// never a hang: implementations make sure a lost peer ends the operation within seconds.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "loom/component.hpp"

namespace loom {

enum class ReduceOp { sum, max, min };

class Collective : public Component {
 public:
  static constexpr std::string_view kind = "collective";
  ~Collective() override;

  // This process's rank in [0, size()), and the number of processes of the run.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What carries the traffic, for the run's log ("OpenMPI 4.1.4, 2 ranks on 1 host").
  virtual std::string describe() const = 0;

  // Combines `data` element-wise over all ranks, in place. The order of the reduction is fixed
  // for a given size(): the same inputs give the same bits on every rank and on every run.
  virtual void all_reduce(std::span<float> data, ReduceOp op = ReduceOp::sum) = 0;
  // The same over doubles (losses, token counts, checksums: where float32 would round).
  virtual void all_reduce(std::span<double> data, ReduceOp op = ReduceOp::sum) = 0;

  // in.size() == out.size() * size(). Rank r receives the sum over ranks of chunk r of `in`
  // (elements [r * out.size(), (r + 1) * out.size())). `out` may be that chunk of `in` itself
  // (in place); otherwise the two do not overlap. Implementations take memory of their own that
  // does not grow with the buffer (a ZeRO-1 run reduces all its gradients at once).
  virtual void reduce_scatter(std::span<const float> in, std::span<float> out) = 0;
  // out.size() == in.size() * size(). Every rank receives every rank's `in`, in rank order.
  // `in` may be this rank's chunk of `out` itself (in place); otherwise the two do not overlap.
  virtual void all_gather(std::span<const float> in, std::span<float> out) = 0;

  // Rank `root`'s bytes, copied into every rank's `data` (same size everywhere).
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
};

}  // namespace loom
