#include "train/world.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "loom/error.hpp"
#include "loom/tensor.hpp"
#include "loom/token_shard.hpp"

namespace loom::training {

namespace {

// The ranks whose flag is set, as "1, 3".
std::string flagged_ranks(const std::vector<double>& flags) {
  std::string ranks;
  for (std::size_t r = 0; r < flags.size(); ++r)
    if (flags[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  return ranks;
}

// Every rank sets its own slot when `differs`; all learn which ranks did.
std::vector<double> gather_flags(Collective& c, bool differs) {
  std::vector<double> flags(static_cast<std::size_t>(c.size()), 0.0);
  flags[static_cast<std::size_t>(c.rank())] = differs ? 1.0 : 0.0;
  c.all_reduce(std::span<double>(flags));
  return flags;
}

bool differs_from_rank0(Collective& c, std::uint32_t mine) {
  std::uint32_t rank0 = mine;
  c.broadcast(std::as_writable_bytes(std::span<std::uint32_t>(&rank0, 1)), 0);
  return rank0 != mine;
}

// The environment variable `name` as a whole number, or -1 when unset or not a number.
int env_int(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text) return -1;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return *end == '\0' && value >= 0 && value < (1 << 30) ? static_cast<int>(value) : -1;
}

std::string env_text(const char* name) {
  const char* text = std::getenv(name);
  return std::string(name) + "=" + (text ? text : "");
}

// The `type` a collective node names: `mpi`, or {type: mpi}.
std::string collective_type(const Value& node) {
  if (node.is_string()) return node.as_string();
  if (node.is_map())
    if (const Value* type = node.find("type"); type && type->is_string()) return type->as_string();
  return "?";
}

}  // namespace

Launcher launcher_from_environment() {
  Launcher l;
  if (const int size = env_int("OMPI_COMM_WORLD_SIZE"); size >= 0) {
    l.kind = Launcher::Kind::openmpi;
    l.description = "OpenMPI's mpirun (" + env_text("OMPI_COMM_WORLD_SIZE") + ")";
    l.size = size;
    return l;
  }
  const int srun_tasks = env_int("SLURM_STEP_NUM_TASKS");
  if (std::getenv("PMI_RANK") || std::getenv("PMI_SIZE")) {
    l.kind = Launcher::Kind::other;
    l.description = "MPICH's or Intel MPI's mpiexec, or another PMI launcher (" + env_text("PMI_RANK") + ", " +
                    env_text("PMI_SIZE") + ")";
    l.size = std::max(0, env_int("PMI_SIZE"));
  } else if (std::getenv("PMIX_RANK")) {
    l.kind = Launcher::Kind::other;
    if (srun_tasks >= 0) {
      l.description =
          "Slurm's srun over PMIx (" + env_text("PMIX_RANK") + ", " + env_text("SLURM_STEP_NUM_TASKS") + ")";
      l.size = srun_tasks;
    } else {
      l.description = "a PMIx launcher (" + env_text("PMIX_RANK") + ")";  // which does not say how many
    }
  } else if (srun_tasks >= 0) {
    // SLURM_STEP_NUM_TASKS: srun's, not the batch script's (which has SLURM_NTASKS and SLURM_PROCID=0).
    l.kind = Launcher::Kind::other;
    l.description = "Slurm's srun (" + env_text("SLURM_PROCID") + ", " + env_text("SLURM_STEP_NUM_TASKS") + ")";
    l.size = srun_tasks;
  }
  return l;
}

Handle<Collective> create_collective(const Registry& registry, const Value& config) {
  const Launcher launcher = launcher_from_environment();
  const Value* node = config.find("collective");
  const bool named = node && !node->is_null();
  if (!named && launcher.kind == Launcher::Kind::other && launcher.size != 1) {
    const std::string count = launcher.size > 1 ? std::to_string(launcher.size) : "N";
    throw UserError(launcher.description + " started this process" +
                    (launcher.size > 1 ? ", one of " + count : std::string()) +
                    ", but loom's `mpi` collective runs over OpenMPI and needs OpenMPI's mpirun: without it each "
                    "process would train alone, all of them on one run directory. Start the run with "
                    "`mpirun -np " +
                    count +
                    " loom train CONFIG` (OpenMPI's; inside a Slurm allocation it starts the ranks on the allocated "
                    "nodes), or with one process and no launcher (docs/distributed.md)");
  }
  const std::string name = named ? collective_type(*node) : launcher.kind == Launcher::Kind::openmpi ? "mpi" : "single";
  Handle<Collective> collective =
      named ? registry.create<Collective>(ComponentRef{"collective", "", *node, "collective"})
            : with_context(
                  launcher.kind == Launcher::Kind::openmpi
                      ? "under mpirun (OMPI_COMM_WORLD_SIZE is set), loom uses collective `mpi`"
                      : "while creating the default collective",
                  [&] {
                    return registry.create<Collective>(ComponentRef{"collective", name, Value(name), "collective"});
                  });
  if (launcher.size > 1 && collective->size() != launcher.size)
    throw UserError("collective `" + name + "` connects " + std::to_string(collective->size()) + " process" +
                    (collective->size() == 1 ? "" : "es") + ", but " + launcher.description + " started " +
                    std::to_string(launcher.size) +
                    ": each would train on its own, all of them on one run directory. Under OpenMPI's mpirun "
                    "leave `collective` unset (loom picks `mpi`)" +
                    (launcher.kind == Launcher::Kind::other ? "; `mpi` needs OpenMPI's mpirun" : ""));
  return collective;
}

World::World(Handle<Collective> collective)
    : collective_(std::move(collective)), rank_(collective_->rank()), size_(collective_->size()) {
  if (size_ == 1) return;
  // (pid, CRC of the host name) of every rank; both are exact in a double.
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::vector<double> slots(2 * static_cast<std::size_t>(size_), 0.0);
  slots[2 * static_cast<std::size_t>(rank_)] = static_cast<double>(::getpid());
  slots[2 * static_cast<std::size_t>(rank_) + 1] = crc32(std::as_bytes(std::span(host, std::strlen(host))));
  collective_->all_reduce(std::span<double>(slots));
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && slots[2 * static_cast<std::size_t>(r) + 1] == slots[2 * static_cast<std::size_t>(rank_) + 1])
      same_host_peers_.push_back({r, static_cast<int>(slots[2 * static_cast<std::size_t>(r)])});
}

void World::settle(std::exception_ptr error) {
  if (size_ == 1) {
    if (error) std::rethrow_exception(error);
    return;
  }
  // This rank's error as a loom::Error (anything else is an internal one), and as a number the
  // ranks compare: 0 for none, else 1 + (internal) + 2 x the CRC of its text.
  std::unique_ptr<Error> mine;
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      mine = std::make_unique<Error>(e);
    } catch (const std::exception& e) {
      mine = std::make_unique<InternalError>(e.what());
    } catch (...) {
      mine = std::make_unique<InternalError>("an exception that is not a std::exception");
    }
  }
  std::vector<double> outcomes(static_cast<std::size_t>(size_), 0.0);
  if (mine) {
    const std::string text = mine->what();
    outcomes[static_cast<std::size_t>(rank_)] =
        1.0 + (mine->kind() == ErrorKind::internal ? 1.0 : 0.0) + 2.0 * crc32(std::as_bytes(std::span(text)));
  }
  collective_->all_reduce(std::span<double>(outcomes));
  const auto first = std::find_if(outcomes.begin(), outcomes.end(), [](double o) { return o != 0; });
  if (first == outcomes.end()) return;
  if (!report_) {
    if (error) std::rethrow_exception(error);
  } else if (mine && (rank_ == 0 || outcomes[static_cast<std::size_t>(rank_)] != outcomes[0])) {
    if (rank_ != 0) mine->add_context("rank " + std::to_string(rank_));
    report_(*mine);
  }
  // The reports are out before any rank exits (the launcher ends the others when one does).
  collective_->barrier();
  const int reporter = static_cast<int>(first - outcomes.begin());
  throw ReportedError(std::fmod(*first, 2.0) == 0.0 ? ErrorKind::internal : ErrorKind::user,
                      "an error reported by rank " + std::to_string(reporter));
}

void World::report_together(const Error& error) {
  if (size_ == 1 || !report_) return;
  if (rank_ == 0) report_(error);
  collective_->barrier();
  throw ReportedError(error.kind(), "an error reported by rank 0");
}

Mesh resolve_mesh(const Options& trainer, int world_size) {
  const Options section = trainer.object("mesh");
  Mesh::Sizes requested{};
  for (MeshAxis axis : mesh_axes) requested[static_cast<std::size_t>(axis)] = section.get<int>(mesh_axis_name(axis));
  const Mesh mesh = Mesh::resolve(requested, world_size, "trainer.mesh");
  if (mesh.size(MeshAxis::tensor) > 1 && trainer.get<bool>("shard_optimizer_state"))
    throw UserError("trainer.mesh (" + mesh.describe() +
                    "): trainer.shard_optimizer_state (ZeRO-1) does not combine with tensor parallelism yet; set it to "
                    "false, or trainer.mesh.tensor to 1");
  if (mesh.size(MeshAxis::fsdp) > 1 && trainer.get<bool>("shard_optimizer_state"))
    throw UserError("trainer.mesh (" + mesh.describe() +
                    ") shards the optimizer state along its fsdp axis already (ZeRO-3); "
                    "trainer.shard_optimizer_state (ZeRO-1) is for the data axis of a mesh without one: set it to "
                    "false, or trainer.mesh.fsdp to 1");
  return mesh;
}

void World::set_mesh(const Mesh& mesh) {
  if (data_group_) throw InternalError("World: the mesh is set once");
  mesh_ = mesh;
  data_group_ = collective_->group(mesh_, MeshAxis::data);
  fsdp_group_ = collective_->group(mesh_, MeshAxis::fsdp);
  tensor_group_ = collective_->group(mesh_, MeshAxis::tensor);
  // Every rank takes its own rows of each batch, except that the members of a tensor group take
  // the same ones: the rows are dealt over the ranks of one tensor coordinate, in rank order.
  replica_group_ = mesh_.size(MeshAxis::tensor) == 1
                       ? std::shared_ptr<CollectiveGroup>(std::shared_ptr<CollectiveGroup>{}, collective_.get())
                       : collective_->split(mesh_.coordinate(rank_, MeshAxis::tensor), rank_);
  replica_rank_ = replica_group_->rank();
  replicas_ = replica_group_->size();
  // Without an fsdp axis the data axis is every such rank, in the same order (so the same bits
  // as the world); with one, the gradients of the parameters outside FSDP's units are summed
  // over all of them.
  if (mesh_.size(MeshAxis::fsdp) == 1 && (data_group_->size() != replicas_ || data_group_->rank() != replica_rank_))
    throw InternalError("World: the data axis of mesh " + mesh_.describe() + " is not every replica");
}

void World::check_batch(std::int64_t batch_size, std::int64_t micro_size) const {
  if (batch_size % (static_cast<std::int64_t>(replicas_) * micro_size) != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size) + ") must be a multiple of " +
                    std::to_string(size_) + " ranks x the micro-batch size (" + std::to_string(micro_size) +
                    "): every rank takes an equal slice of each global batch, in whole micro-batches");
}

void World::check_same_config(const Value& config) {
  if (size_ == 1) return;
  const std::string yaml = config.to_yaml();
  const auto flags =
      gather_flags(*collective_, differs_from_rank0(*collective_, crc32(std::as_bytes(std::span(yaml)))));
  if (const std::string ranks = flagged_ranks(flags); !ranks.empty())
    throw UserError("the resolved config of rank " + ranks + " differs from rank 0's: every rank of `mpirun -np " +
                    std::to_string(size_) +
                    "` must be given the same config file and overrides (compare `loom config show` on each)");
}

void World::check_same_parameters(const std::vector<ModelParameter>& parameters) {
  if (size_ == 1) return;
  std::uint32_t crc = 0;
  for (const auto& p : parameters) {
    // Contiguous, as every parameter; a device's, read through one explicit copy (once per run).
    const Tensor t =
        p.parameter->data().is_host_visible() ? p.parameter->data() : p.parameter->data().to(Device::host());
    crc = crc32(std::as_bytes(std::span(t.data<float>(), static_cast<std::size_t>(t.numel()))), crc);
  }
  // Each rank's checksum against that of the first rank of its tensor coordinate (rank t: the
  // tensor axis is innermost), which holds the same shards.
  std::vector<double> crcs(static_cast<std::size_t>(size_), 0.0);
  crcs[static_cast<std::size_t>(rank_)] = crc;
  collective_->all_reduce(std::span<double>(crcs));
  const int first = mesh_.coordinate(rank_, MeshAxis::tensor);
  const auto flags = gather_flags(*collective_, crcs[static_cast<std::size_t>(first)] != crc);
  if (const std::string ranks = flagged_ranks(flags); !ranks.empty())
    throw UserError("the initial weights of rank " + ranks + " differ from rank " +
                    (mesh_.size(MeshAxis::tensor) > 1 ? std::string("0's (or, along the tensor axis, rank t's)")
                                                      : std::string("0's")) +
                    " (checksum of every parameter): the ranks must initialise from the same trainer.seed and "
                    "trainer.init_from; is the same loom and plugin build on every node?");
}

double World::sum(double value) {
  if (replicas_ == 1) return value;
  replica_group_->all_reduce(std::span<double>(&value, 1));
  return value;
}

double World::sum_over_ranks(double value) {
  if (size_ == 1) return value;
  collective_->all_reduce(std::span<double>(&value, 1));
  return value;
}

void World::broadcast(std::string& text, int root) {
  if (size_ == 1) return;
  std::uint64_t length = text.size();
  collective_->broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), root);
  text.resize(length);
  collective_->broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
}

int World::max_over_ranks(int signal) {
  if (size_ == 1) return signal;
  double s = signal;
  collective_->all_reduce(std::span<double>(&s, 1), ReduceOp::max);
  return static_cast<int>(s);
}

}  // namespace loom::training
