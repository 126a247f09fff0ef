// The world: the ranks of a run and what they do together whatever parallelism the mesh lays out.
// One rank's place among them (rank, size, the other ranks on its host), the agreement on errors
// (together, fail_together) and on stop signals and decisions (max_over_ranks), the broadcasts
// and sums, the checks that every rank runs the same config from the same weights, the mesh with
// its groups, and the rows of each batch that are this rank's. The parallelisms
// (train/strategy.hpp) use it; none of them is part of it.
//
// The contract. The constructor, set_mesh, check_same_config, check_same_parameters, together,
// fail_together, sum, sum_over_ranks, broadcast and max_over_ranks are collective: every rank
// calls them at the same point, in the same order (a rank that skipped one would leave its peers
// waiting). The rest only reads what this rank knows. With one rank (the `single` collective)
// every collective call is the identity and communicates nothing: together() rethrows the body's
// error, fail_together() throws its error, the same-config and same-parameter checks pass.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/kinds/model.hpp"
#include "loom/mesh.hpp"
#include "loom/options.hpp"
#include "loom/run/trainer.hpp"
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

class World {
 public:
  // With more than one rank, the ranks tell each other their host and pid (one all-reduce). The
  // ranks can agree on errors from here on (together()), before the config is resolved.
  explicit World(Handle<Collective> collective);
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  // `mesh` (resolve_mesh) lays out the collective's ranks, and the groups along its axes are made.
  // Every rank calls it at the same point, once, before anything asks for a group or the rows.
  void set_mesh(const Mesh& mesh);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_primary() const { return rank_ == 0; }
  // The other ranks on this host.
  const std::vector<PeerProcess>& same_host_peers() const { return same_host_peers_; }
  Collective& collective() { return *collective_; }
  const Mesh& mesh() const { return mesh_; }
  // The groups along the mesh's axes (after set_mesh): the ranks that sum their gradients (data),
  // that share one set of shards (fsdp), that split each layer's matrices (tensor; a group of one
  // without that axis).
  const std::shared_ptr<CollectiveGroup>& data_group() const { return data_group_; }
  const std::shared_ptr<CollectiveGroup>& fsdp_group() const { return fsdp_group_; }
  const std::shared_ptr<CollectiveGroup>& tensor_group() const { return tensor_group_; }
  bool fully_sharded() const { return mesh_.size(MeshAxis::fsdp) > 1; }
  bool tensor_parallel() const { return mesh_.size(MeshAxis::tensor) > 1; }
  // This rank's position among the ranks that take different rows of each batch (data x fsdp:
  // the members of one tensor group take the same rows), and their number.
  CollectiveGroup& replica_group() const { return *replica_group_; }
  int replica_rank() const { return replica_rank_; }
  int replicas() const { return replicas_; }

  // Rows [first, first + count) of a global batch of `batch_size` sequences are this rank's.
  // batch_size must be a multiple of replicas() * micro_size (a UserError says so otherwise).
  void check_batch(std::int64_t batch_size, std::int64_t micro_size) const;
  std::int64_t first_row(std::int64_t batch_size) const { return batch_size / replicas_ * replica_rank_; }
  std::int64_t row_count(std::int64_t batch_size) const { return batch_size / replicas_; }

  // Every rank must run the same config: a UserError naming the ranks whose resolved config
  // differs from rank 0's.
  void check_same_config(const Value& config);
  // And start from the same weights: a UserError naming the ranks whose parameters differ (from
  // those of the first rank of their tensor coordinate, which holds the same shards).
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

 private:
  void settle(std::exception_ptr error);
  // fail_together()'s report: throws ReportedError, or returns where `error` is to be thrown.
  void report_together(const Error& error);

  Handle<Collective> collective_;
  Mesh mesh_;
  // The groups along the mesh's axes (declared after collective_: released before it).
  std::shared_ptr<CollectiveGroup> data_group_;
  std::shared_ptr<CollectiveGroup> fsdp_group_;
  std::shared_ptr<CollectiveGroup> tensor_group_;
  // The ranks of this rank's tensor coordinate (data x fsdp), in rank order: they take different
  // rows; every rank when there is no tensor axis.
  std::shared_ptr<CollectiveGroup> replica_group_;
  int replica_rank_ = 0, replicas_ = 1;
  int rank_ = 0, size_ = 1;
  std::function<void(const Error&)> report_;
  std::vector<PeerProcess> same_host_peers_;
};

}  // namespace loom::training
