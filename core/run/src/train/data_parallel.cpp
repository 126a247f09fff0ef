#include "train/data_parallel.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "loom/error.hpp"
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

// A staged bucket's all-reduce: the sum arrives in the host copy, which goes back to the device
// when it is waited for.
class StagedPending final : public CollectiveGroup::Pending {
 public:
  StagedPending(std::unique_ptr<CollectiveGroup::Pending> inner, Tensor device, Tensor host)
      : inner_(std::move(inner)), device_(std::move(device)), host_(std::move(host)) {}
  void wait() override {
    inner_->wait();
    device_.copy_from(host_);
  }

 private:
  std::unique_ptr<CollectiveGroup::Pending> inner_;
  Tensor device_, host_;
};

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

DataParallel::DataParallel(Handle<Collective> collective)
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

void DataParallel::settle(std::exception_ptr error) {
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

void DataParallel::report_together(const Error& error) {
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

void DataParallel::set_mesh(const Mesh& mesh) {
  if (data_group_) throw InternalError("data parallel: the mesh is set once");
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
    throw InternalError("data parallel: the data axis of mesh " + mesh_.describe() + " is not every replica");
}

void DataParallel::check_batch(std::int64_t batch_size, std::int64_t micro_size) const {
  if (batch_size % (static_cast<std::int64_t>(replicas_) * micro_size) != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size) + ") must be a multiple of " +
                    std::to_string(size_) + " ranks x the micro-batch size (" + std::to_string(micro_size) +
                    "): every rank takes an equal slice of each global batch, in whole micro-batches");
}

void DataParallel::check_same_config(const Value& config) {
  if (size_ == 1) return;
  const std::string yaml = config.to_yaml();
  const auto flags =
      gather_flags(*collective_, differs_from_rank0(*collective_, crc32(std::as_bytes(std::span(yaml)))));
  if (const std::string ranks = flagged_ranks(flags); !ranks.empty())
    throw UserError("the resolved config of rank " + ranks + " differs from rank 0's: every rank of `mpirun -np " +
                    std::to_string(size_) +
                    "` must be given the same config file and overrides (compare `loom config show` on each)");
}

void DataParallel::check_same_parameters(const std::vector<ModelParameter>& parameters) {
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

void DataParallel::attach(const std::vector<ModelParameter>& parameters, std::int64_t bucket_bytes) {
  if (size_ == 1) return;
  for (const auto& p : parameters)
    if (p.parameter->requires_grad()) {
      decide_staging(p.parameter->tensor().device(), replicated_group());
      break;
    }
  // Backward produces the last layers' gradients first: buckets in reverse parameter order.
  std::int64_t filled = 0;
  std::vector<std::pair<Parameter*, std::int64_t>> pending;
  auto close = [&] {
    if (pending.empty()) return;
    Bucket b;
    b.storage = Tensor::zeros(Shape{filled}, DType::f32, pending.front().first->tensor().device());
    if (staged_) b.host = Tensor::zeros(Shape{filled});
    for (auto& [p, offset] : pending) {
      p->set_grad_buffer(b.storage.slice(0, offset, offset + p->tensor().numel()).view(p->shape()));
      b.parameters.emplace_back(p, offset);
      bucket_of_[p] = buckets_.size();
    }
    buckets_.push_back(std::move(b));
    pending.clear();
    filled = 0;
  };
  for (auto it = parameters.rbegin(); it != parameters.rend(); ++it) {
    Parameter* p = it->parameter;
    if (!p->requires_grad()) continue;
    const std::int64_t n = p->tensor().numel();
    if (filled > 0 && (filled + n) * 4 > bucket_bytes) close();
    pending.emplace_back(p, filled);
    filled += n;
    parameters_.push_back(p);
  }
  close();
  has_grad_.assign(parameters_.size(), 0.0f);
}

void DataParallel::shard(const std::vector<ModelParameter>& parameters) {
  if (size_ == 1) return;
  sharded_ = true;
  std::int64_t total = 0;
  for (const auto& p : parameters)
    if (p.parameter->requires_grad()) total += p.parameter->tensor().numel();
  // Contiguous shards in parameter order: a parameter goes to the rank whose share of the total
  // its first element falls in.
  std::vector<std::int64_t> filled(static_cast<std::size_t>(size_), 0);
  std::vector<std::pair<Parameter*, int>> assignment;
  std::int64_t start = 0;
  for (const auto& mp : parameters) {
    Parameter* p = mp.parameter;
    if (!p->requires_grad()) continue;
    const int rank =
        static_cast<int>(std::min<std::int64_t>(size_ - 1, start * size_ / std::max<std::int64_t>(1, total)));
    assignment.emplace_back(p, rank);
    filled[static_cast<std::size_t>(rank)] += p->tensor().numel();
    start += p->tensor().numel();
  }
  segment_ = *std::max_element(filled.begin(), filled.end());
  flat_grads_ = Tensor::zeros(Shape{segment_ * size_}, DType::f32, assignment.front().first->tensor().device());
  decide_staging(flat_grads_.device(), *data_group_);
  if (staged_) host_flat_ = Tensor::zeros(Shape{segment_ * size_});
  std::fill(filled.begin(), filled.end(), 0);
  for (auto& [p, rank] : assignment) {
    const std::int64_t offset = segment_ * rank + filled[static_cast<std::size_t>(rank)];
    filled[static_cast<std::size_t>(rank)] += p->tensor().numel();
    p->set_grad_buffer(flat_grads_.slice(0, offset, offset + p->tensor().numel()).view(p->shape()));
    layout_.emplace_back(p, offset, rank);
    parameters_.push_back(p);
    if (rank == rank_) owned_.insert(p);
    owner_[p] = rank;
  }
  has_grad_.assign(parameters_.size(), 0.0f);
}

void DataParallel::reduce_scatter_gradients() {
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    auto& [p, offset, rank] = layout_[i];
    has_grad_[i] = p->has_grad() ? 1.0f : 0.0f;
    if (!p->has_grad()) zero(flat_grads_, offset, p->tensor().numel());
  }
  // Staged: the whole buffer to the host, and this rank's summed segment back.
  if (staged_) host_flat_.copy_from(flat_grads_);
  float* flat = (staged_ ? host_flat_ : flat_grads_).data<float>();
  data_group_->all_reduce(std::span<float>(has_grad_), ReduceOp::max);
  // In place: this rank's segment of the buffer receives its sums. No buffer of the gradients'
  // size besides theirs, so the run's memory falls by the optimizer state the shard saves.
  const std::size_t segment = static_cast<std::size_t>(segment_);
  data_group_->reduce_scatter(std::span<const float>(flat, segment * static_cast<std::size_t>(size_)),
                              std::span<float>(flat + segment * static_cast<std::size_t>(rank_), segment));
  if (staged_) {
    const std::int64_t begin = segment_ * rank_;
    flat_grads_.slice(0, begin, begin + segment_).copy_from(host_flat_.slice(0, begin, begin + segment_));
  }
  // This rank's shard holds the sums; the rest of the buffer is not a gradient of anything.
  for (std::size_t i = 0; i < layout_.size(); ++i) {
    auto& [p, offset, rank] = layout_[i];
    if (rank == rank_ && has_grad_[i] != 0.0f)
      p->mark_grad_written();
    else
      p->zero_grad();
  }
}

void DataParallel::gather_parameters() {
  if (!sharded_) return;
  const auto start = std::chrono::steady_clock::now();
  // The gradient buffer carries the weights: the step is done with the gradients, and this rank's
  // updated shard goes into its segment, every rank's to every rank, in place.
  // (Tensor copies: memcpy on the host, the device's own copy on a device.) Staged, the buffer
  // goes to the host after this rank's weights are in, and comes back with every rank's.
  const std::size_t segment = static_cast<std::size_t>(segment_);
  for (auto& [p, offset, rank] : layout_) {
    if (rank != rank_) continue;
    const Tensor v = p->data();
    flat_grads_.slice(0, offset, offset + v.numel()).view(v.shape()).copy_from(v);
    p->zero_grad();  // its storage holds weights now
  }
  if (staged_) host_flat_.copy_from(flat_grads_);
  float* flat = (staged_ ? host_flat_ : flat_grads_).data<float>();
  data_group_->all_gather(std::span<const float>(flat + segment * static_cast<std::size_t>(rank_), segment),
                          std::span<float>(flat, segment * static_cast<std::size_t>(size_)));
  if (staged_) flat_grads_.copy_from(host_flat_);
  for (auto& [p, offset, rank] : layout_) {
    if (rank == rank_) continue;
    const Tensor v = p->data();
    v.copy_from(flat_grads_.slice(0, offset, offset + v.numel()).view(v.shape()));
  }
  communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void DataParallel::zero(const Tensor& buffer, std::int64_t offset, std::int64_t n) {
  if (buffer.is_host_visible()) {
    std::memset(buffer.data<float>() + offset, 0, static_cast<std::size_t>(n) * sizeof(float));
    return;
  }
  if (!backend_) throw InternalError("DataParallel: gradient buckets in device memory, but no backend to zero them");
  backend_->fill(buffer.device_data<float>() + offset, 0.0f, n);
}

void DataParallel::gradient_ready(Parameter& p) {
  if (size_ == 1 || sharded_) return;
  const auto it = bucket_of_.find(&p);
  if (it == bucket_of_.end()) return;
  ++buckets_[it->second].ready;
  start_ready_buckets();
}

void DataParallel::start_ready_buckets() {
  while (started_ < buckets_.size() && buckets_[started_].ready >= buckets_[started_].parameters.size()) {
    Bucket& b = buckets_[started_++];
    // A parameter that no micro-batch of this rank reached contributes zeros.
    for (auto& [p, offset] : b.parameters)
      if (!p->has_grad()) zero(b.storage, offset, p->tensor().numel());
    if (staged_) {
      b.host.copy_from(b.storage);
      pending_.push_back(
          std::make_unique<StagedPending>(replicated_group().start_all_reduce(std::span<float>(
                                              b.host.data<float>(), static_cast<std::size_t>(b.host.numel()))),
                                          b.storage, b.host));
    } else {
      pending_.push_back(replicated_group().start_all_reduce(
          std::span<float>(b.storage.data<float>(), static_cast<std::size_t>(b.storage.numel()))));
    }
  }
}

void DataParallel::decide_staging(const Device& device, const CollectiveGroup& group) {
  staged_ = !group.can_send_from(buffer_type_of(device));
}

std::string DataParallel::staging_note() const {
  if (!staged_) return "";
  const std::string device = (sharded_ ? flat_grads_ : buckets_.front().storage).device().str();
  return "note: the collective (" + collective_->describe() + ") cannot send from " + device +
         " memory: the gradients are staged through host memory (" +
         (sharded_ ? std::string("two copies for the reduce-scatter and two for the gather each step")
                   : "two copies per bucket and step, " + std::to_string(buckets_.size()) + " bucket" +
                         (buckets_.size() == 1 ? "" : "s")) +
         "); a collective that reads the device's memory itself (CUDA-aware MPI, NCCL) says so by "
         "CollectiveGroup::can_send_from";
}

void DataParallel::start_remaining_buckets() {
  if (size_ == 1 || sharded_) return;
  for (auto& b : buckets_) b.ready = b.parameters.size();
  start_ready_buckets();
}

void DataParallel::reduce_gradients() {
  if (size_ == 1) return;
  const auto start = std::chrono::steady_clock::now();
  if (sharded_) {
    reduce_scatter_gradients();
    communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }
  // Buckets not started yet (start_remaining_buckets() was not called) start now, in order.
  start_remaining_buckets();
  // Which parameters any rank's micro-batches reached: those get the sum; the others stay
  // without a gradient, as on one process.
  for (std::size_t i = 0; i < parameters_.size(); ++i) has_grad_[i] = parameters_[i]->has_grad() ? 1.0f : 0.0f;
  replicated_group().all_reduce(std::span<float>(has_grad_), ReduceOp::max);
  for (auto& p : pending_) p->wait();
  pending_.clear();
  for (auto& b : buckets_) b.ready = 0;
  started_ = 0;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (has_grad_[i] != 0.0f) parameters_[i]->mark_grad_written();
  communication_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double DataParallel::sum(double value) {
  if (replicas_ == 1) return value;
  replica_group_->all_reduce(std::span<double>(&value, 1));
  return value;
}

double DataParallel::sum_over_ranks(double value) {
  if (size_ == 1) return value;
  collective_->all_reduce(std::span<double>(&value, 1));
  return value;
}

void DataParallel::broadcast(std::string& text, int root) {
  if (size_ == 1) return;
  std::uint64_t length = text.size();
  collective_->broadcast(std::as_writable_bytes(std::span<std::uint64_t>(&length, 1)), root);
  text.resize(length);
  collective_->broadcast(std::as_writable_bytes(std::span<char>(text.data(), text.size())), root);
}

int DataParallel::max_over_ranks(int signal) {
  if (size_ == 1) return signal;
  double s = signal;
  collective_->all_reduce(std::span<double>(&s, 1), ReduceOp::max);
  return static_cast<int>(s);
}

double DataParallel::take_communication_seconds() {
  const double s = communication_seconds_;
  communication_seconds_ = 0;
  return s;
}

}  // namespace loom::training
