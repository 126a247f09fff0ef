// Data parallelism: the ranks of a run each take a slice of every global batch, and their
// gradients are summed in buckets so that every rank applies the same update. With one rank (the
// `single` collective) every operation here is the identity and costs nothing.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"
#include "loom/mesh.hpp"
#include "loom/run/trainer.hpp"
#include "loom/tensor.hpp"
#include "loom/value.hpp"

namespace loom::training {

// The launcher that started this process, as its environment says.
struct Launcher {
  enum class Kind { none, openmpi, other };
  Kind kind = Kind::none;
  // What was seen, for messages: "Slurm's srun (SLURM_PROCID=1, SLURM_STEP_NUM_TASKS=3)".
  std::string description;
  int size = 0;  // the processes it started; 0 where the environment does not say
};
// OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE), MPICH's or Intel MPI's mpiexec (PMI_RANK, PMI_SIZE),
// a PMIx launcher (PMIX_RANK), Slurm's srun (SLURM_STEP_NUM_TASKS, SLURM_PROCID); OpenMPI's
// variables win where several are set (mpirun inside a Slurm allocation).
Launcher launcher_from_environment();

// The collective the config's `collective` section names (the raw or the resolved config); when
// it names none, `mpi` under OpenMPI's mpirun and `single` without a launcher. A launcher other
// than OpenMPI's that started several processes is a UserError naming it (each process would
// otherwise train alone, all of them on one run directory), and so is a collective whose size
// differs from the number of processes the launcher started.
Handle<Collective> create_collective(const Registry& registry, const Value& config);

// trainer.mesh on `world_size` ranks: a UserError, before anything is allocated, for a mesh that
// does not fit them, or that combines fsdp > 1 with ZeRO-1 (trainer.shard_optimizer_state).
Mesh resolve_mesh(const Options& trainer, int world_size);

// Another rank's process on this host (a lost one is noticed by its pid: stop_signals.hpp).
struct PeerProcess {
  int rank = 0;
  int pid = 0;
};

class DataParallel {
 public:
  // With more than one rank, the ranks tell each other their host and pid (one all-reduce). The
  // ranks can agree on errors from here on (together()), before the config is resolved.
  explicit DataParallel(Handle<Collective> collective);
  // `mesh` (resolve_mesh) lays out the collective's ranks; the gradients are summed over the
  // group along its data axis. Every rank calls it at the same point (it makes that group), once,
  // before attach() or shard().
  void set_mesh(const Mesh& mesh);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_primary() const { return rank_ == 0; }
  // The other ranks on this host.
  const std::vector<PeerProcess>& same_host_peers() const { return same_host_peers_; }
  Collective& collective() { return *collective_; }
  const Mesh& mesh() const { return mesh_; }
  // The groups along the mesh's axes (after set_mesh).
  const std::shared_ptr<CollectiveGroup>& data_group() const { return data_group_; }
  const std::shared_ptr<CollectiveGroup>& fsdp_group() const { return fsdp_group_; }
  // The ranks that split each layer's matrices (the tensor axis; a group of one without it).
  const std::shared_ptr<CollectiveGroup>& tensor_group() const { return tensor_group_; }
  bool fully_sharded() const { return mesh_.size(MeshAxis::fsdp) > 1; }
  bool tensor_parallel() const { return mesh_.size(MeshAxis::tensor) > 1; }
  // This rank's position among the ranks that take different rows of each batch (data x fsdp:
  // the members of one tensor group take the same rows), and their number.
  CollectiveGroup& replica_group() const { return *replica_group_; }
  int replica_rank() const { return replica_rank_; }
  int replicas() const { return replicas_; }

  // Rows [first, first + count) of a global batch of `batch_size` sequences are this rank's.
  // batch_size must be a multiple of size() * micro_size (a UserError says so otherwise).
  void check_batch(std::int64_t batch_size, std::int64_t micro_size) const;
  std::int64_t first_row(std::int64_t batch_size) const { return batch_size / replicas_ * replica_rank_; }
  std::int64_t row_count(std::int64_t batch_size) const { return batch_size / replicas_; }

  // Every rank must run the same config: a UserError naming the ranks whose resolved config
  // differs from rank 0's.
  void check_same_config(const Value& config);
  // And start from the same weights: a UserError naming the ranks whose parameters differ.
  void check_same_parameters(const std::vector<ModelParameter>& parameters);

  // How an error is printed (the `loom` command's "loom: error: ..."). Without one, together()
  // and fail_together() throw each rank's own error on the ranks that failed.
  void set_error_reporter(std::function<void(const Error&)> report) { report_ = std::move(report); }
  // Runs `body` on every rank and agrees on how it ended, so that an error is printed once: when
  // any rank's body threw, the ranks that failed report their error (a rank other than 0 only
  // when its error differs from rank 0's, with its rank as context), all wait for the reports,
  // and every rank throws ReportedError. `body` must make the same collective calls on every
  // rank whatever fails in it (most make none). One small all-reduce.
  template <class F>
  void together(F&& body) {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
    }
    settle(error);
  }
  // An error every rank raises alike, from values the ranks agree on (a summed loss, a shared
  // config): rank 0 reports it and every rank throws ReportedError (one process, or no
  // reporter: `error` itself). Every rank must call it.
  template <class E>
  [[noreturn]] void fail_together(const E& error) {
    report_together(error);
    throw error;
  }

  // Gives the parameters gradient storage in flat buckets of about `bucket_bytes`
  // (trainer.grad_bucket_mb), in the order backward produces them, so that reduce_gradients()
  // reduces in place. Call once, before the first step.
  void attach(const std::vector<ModelParameter>& parameters, std::int64_t bucket_bytes);
  // ZeRO-1 instead (trainer.shard_optimizer_state): the parameters are split into size()
  // contiguous shards of about equal size; this rank's optimizer holds the state of its shard
  // only. Gradients are reduce-scattered (each rank receives the sum of its shard), the rank
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
  // The sum over the ranks that take different rows (the members of a tensor group count once:
  // they compute the same losses).
  double sum(double value);
  // The sum over every rank of the run, the members of a tensor group each counted (what each
  // rank has of its own: its roof for MFU).
  double sum_over_ranks(double value);
  // Rank `root`'s `text`, on every rank.
  void broadcast(std::string& text, int root = 0);
  // The largest `value` of any rank, on every rank: a stop signal or a decision (0 or 1) that one
  // rank's clock or signal handler made and all must follow.
  int max_over_ranks(int signal);
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
  void settle(std::exception_ptr error);
  // fail_together()'s report: throws ReportedError, or returns where `error` is to be thrown.
  void report_together(const Error& error);

  Handle<Collective> collective_;
  Mesh mesh_;
  // The ranks that sum their gradients: along the data axis (released before collective_).
  std::shared_ptr<CollectiveGroup> data_group_;
  std::shared_ptr<CollectiveGroup> fsdp_group_;    // the ranks that share one set of shards
  std::shared_ptr<CollectiveGroup> tensor_group_;  // the ranks that split each layer
  // The ranks of this rank's tensor coordinate (data x fsdp), in rank order: they take different
  // rows; every rank when there is no tensor axis.
  std::shared_ptr<CollectiveGroup> replica_group_;
  int replica_rank_ = 0, replicas_ = 1;
  // Where the buckets' gradients (parameters every rank holds whole) are summed: the data axis,
  // which is every rank without an fsdp axis; with one, every rank (LoRA's adapters beside FSDP's
  // units).
  CollectiveGroup& replicated_group() { return fully_sharded() ? *replica_group_ : *data_group_; }
  int rank_ = 0, size_ = 1;
  std::function<void(const Error&)> report_;
  std::vector<PeerProcess> same_host_peers_;
  std::vector<Bucket> buckets_;
  std::unordered_map<const Parameter*, std::size_t> bucket_of_;
  std::size_t started_ = 0;  // buckets_[0..started_) are under way
  std::vector<std::unique_ptr<CollectiveGroup::Pending>> pending_;
  std::vector<Parameter*> parameters_;
  // ZeRO-1: one flat gradient buffer of size() segments of segment_ floats, rank r's parameters
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
