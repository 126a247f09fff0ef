// collective `mpi`: the ranks of an `mpirun` job, over OpenMPI.
//
// One communication thread makes every MPI call of the process (MPI_THREAD_FUNNELED: it is the
// thread that initialised MPI). The step's thread posts operations to it and waits, or, for
// start_all_reduce(), goes on computing while the thread communicates: that is how gradient
// buckets overlap with the backward pass.
//
// Every reduction is deterministic and in rank order: an all-to-all hands the owner of each chunk
// every rank's copy of it, the owner sums them as ((r0 + r1) + r2) + ..., and an all-gather copies
// the result to every rank. So all ranks hold the same bits, the same inputs give the same result
// on every run, and N ranks of one micro-batch each sum their gradients exactly as one process
// sums N micro-batches (a plain MPI_Allreduce promises none of this for floats). It moves as
// many bytes as a ring all-reduce. The all-to-all goes piece by piece through a scratch of
// 8 MiB, and reductions run in place: the memory they take does not grow with the buffer.
//
// Groups (Collective::split, the ranks along one mesh axis) are communicators of their own
// (MPI_Comm_split) with the same operations, made and freed on the communication thread too; so
// the world's operations and every group's run one after the other in the order they were posted.
//
// The launcher. OpenMPI starts the ranks outside mpirun's process group, so `kill -9` of mpirun
// alone would leave them training (and writing the run directory). Under mpirun a watch thread
// notices when this rank's parent (mpirun, or its daemon on another node) is gone: the rank then
// stops as on SIGTERM (it raises it: the trainer saves a checkpoint at the next step boundary,
// the ranks agreeing on which), its output to the dead launcher's pipes failing quietly (SIGPIPE
// is ignored under mpirun: a rank's line must not kill it before it stops cleanly). A rank whose
// communication cannot complete any more (stuck in an operation while a rank of its host is gone,
// or for minutes) exits without one, and without MPI_Finalize, which would wait for the launcher.
#include <dlfcn.h>
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "loom/kinds/collective.hpp"
#include "loom/plugin.hpp"

namespace {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

// The process's MPI: initialised on the communication thread by the first `mpi` component,
// finalised when the last one is destroyed. MPI cannot be initialised twice in one process.
class MpiProcess {
 public:
  MpiProcess() {
    thread_ = std::thread([this] { loop(); });
    call([this] { initialise(); });
    // Under mpirun (which sets OMPI_COMM_WORLD_RANK in the ranks it starts), the launcher watch.
    if (std::getenv("OMPI_COMM_WORLD_RANK")) {
      ::signal(SIGPIPE, SIG_IGN);
      launcher_ = ::getppid();
      watch_ = std::thread([this] { watch_launcher(); });
    }
  }

  ~MpiProcess() {
    stop_watch();
    if (std::uncaught_exceptions() > 0 || launcher_gone_) {
      // Unwinding from an error: a peer may be blocked in a collective that will never
      // complete, and MPI_Finalize would wait for it. Leave the thread and let the process exit
      // with its error status; mpirun then ends the other ranks. (Without its launcher,
      // MPI_Finalize would wait for that.)
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      wake_.notify_all();
      thread_.detach();
      return;
    }
    try {
      call([] { MPI_Finalize(); });
    } catch (...) {
    }
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }

  MpiProcess(const MpiProcess&) = delete;
  MpiProcess& operator=(const MpiProcess&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& describe() const { return description_; }

  // Runs `fn` on the communication thread, after everything posted before it.
  std::future<void> post(std::function<void()> fn) {
    std::packaged_task<void()> task(std::move(fn));
    auto done = task.get_future();
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(std::move(task));
    }
    wake_.notify_one();
    return done;
  }
  void call(std::function<void()> fn) { post(std::move(fn)).get(); }

 private:
  using Clock = std::chrono::steady_clock;

  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) return;
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      busy_since_.store(Clock::now().time_since_epoch().count());
      task();
      busy_since_.store(0);
    }
  }

  static void say(const std::string& text) {
    // Onto stderr, which may be a pipe of the dead launcher: nothing to do when that fails.
    [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text.data(), text.size());
  }

  // The watch thread: twice a second, whether the launcher is still this process's parent.
  void watch_launcher() {
    std::unique_lock lock(watch_mutex_);
    while (!watch_stopping_) {
      watch_wake_.wait_for(lock, std::chrono::milliseconds(500));
      if (watch_stopping_) return;
      if (!launcher_gone_ && ::getppid() != launcher_) {
        launcher_gone_ = true;
        gone_at_ = Clock::now();
        say("loom: rank " + std::to_string(rank_) + ": the launcher (mpirun, pid " + std::to_string(launcher_) +
            ") is gone: stopping as on SIGTERM\n");
        ::kill(::getpid(), SIGTERM);
      }
      if (launcher_gone_ && stuck()) {
        say("loom: rank " + std::to_string(rank_) +
            ": the launcher is gone and an MPI operation cannot complete (a rank is gone): exiting without a "
            "checkpoint\n");
        std::_Exit(1);
      }
    }
  }

  // Without the launcher: whether the communication thread waits in an operation that will not
  // complete (a rank of this host gone, or no progress for two minutes).
  bool stuck() const {
    const auto since = busy_since_.load();
    if (since == 0) return false;
    const auto busy = Clock::now() - Clock::time_point(Clock::duration(since));
    if (busy > std::chrono::minutes(2)) return true;
    if (busy < std::chrono::seconds(5) || Clock::now() - gone_at_ < std::chrono::seconds(5)) return false;
    for (const int pid : host_peers_)
      if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
    return false;
  }

  void stop_watch() {
    if (!watch_.joinable()) return;
    {
      std::lock_guard lock(watch_mutex_);
      watch_stopping_ = true;
    }
    watch_wake_.notify_all();
    watch_.join();
  }

  void initialise() {
    // OpenMPI opens its own components with dlopen and they expect libmpi's symbols to be
    // global; loom loaded this plugin (and with it libmpi) with RTLD_LOCAL. Promote it.
    for (const char* name : {"libmpi.so.40", "libmpi.so"})
      if (dlopen(name, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD)) break;
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) throw loom::InternalError("mpi: MPI is already initialised in this process");
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS)
      throw loom::UserError(
          "mpi: MPI_Init_thread failed: " + mpi_error_text(rc) +
          ". Start loom with mpirun (`mpirun -np 2 loom train CONFIG`) or use collective.type=single");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string library(version, static_cast<std::size_t>(length));
    library = library.substr(0, library.find_first_of(",\n"));
    // Hosts: how many distinct processor names the ranks report.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int name_length = 0;
    MPI_Get_processor_name(name, &name_length);
    std::vector<char> names(static_cast<std::size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                  MPI_COMM_WORLD);
    std::vector<std::string> hosts;
    for (int r = 0; r < size_; ++r)
      hosts.emplace_back(names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    // The pids of the ranks of this host, for the launcher watch.
    std::vector<int> pids(static_cast<std::size_t>(size_));
    int pid = static_cast<int>(::getpid());
    MPI_Allgather(&pid, 1, MPI_INT, pids.data(), 1, MPI_INT, MPI_COMM_WORLD);
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && hosts[static_cast<std::size_t>(r)] == hosts[static_cast<std::size_t>(rank_)])
        host_peers_.push_back(pids[static_cast<std::size_t>(r)]);
    std::sort(hosts.begin(), hosts.end());
    const auto distinct = std::unique(hosts.begin(), hosts.end()) - hosts.begin();
    description_ = library + ", " + std::to_string(size_) + " ranks on " + std::to_string(distinct) +
                   (distinct == 1 ? " host" : " hosts");
  }

  std::thread thread_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::packaged_task<void()>> queue_;
  bool stopping_ = false;
  int rank_ = 0, size_ = 1;
  std::string description_;
  // The launcher watch (under mpirun).
  std::thread watch_;
  std::mutex watch_mutex_;
  std::condition_variable watch_wake_;
  bool watch_stopping_ = false;
  pid_t launcher_ = 0;
  std::atomic<bool> launcher_gone_{false};
  Clock::time_point gone_at_;
  std::atomic<Clock::rep> busy_since_{0};  // when the running operation started; 0: none
  std::vector<int> host_peers_;            // the pids of this host's other ranks
};

std::shared_ptr<MpiProcess> mpi_process() {
  static std::mutex mutex;
  static std::weak_ptr<MpiProcess> current;
  static bool finalised = false;
  std::lock_guard lock(mutex);
  if (auto p = current.lock()) return p;
  if (finalised) throw loom::InternalError("mpi: MPI was finalised in this process and cannot be initialised again");
  finalised = true;  // from here on, once the last component goes, MPI is finalised
  auto p = std::make_shared<MpiProcess>();
  current = p;
  return p;
}

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else
    return MPI_DOUBLE;
}

// The operations on one communicator: the world (Interface = loom::Collective) or a group
// (loom::CollectiveGroup).
template <class Interface>
class MpiCommunicator : public Interface {
 public:
  MpiCommunicator(std::shared_ptr<MpiProcess> process, MPI_Comm comm, int rank, int size)
      : process_(std::move(process)), comm_(comm), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce(std::span<float> data, loom::ReduceOp op) override {
    process_->call([&] { reduce(data, op); });
  }
  void all_reduce(std::span<double> data, loom::ReduceOp op) override {
    process_->call([&] { reduce(data, op); });
  }

  void reduce_scatter(std::span<const float> in, std::span<float> out) override {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      throw loom::InternalError("mpi: reduce_scatter of " + std::to_string(in.size()) + " floats into " +
                                std::to_string(out.size()) + " per rank on " + std::to_string(size()) + " ranks");
    process_->call([&] { scatter_reduce(in.data(), out.data(), out.size(), loom::ReduceOp::sum); });
  }

  void all_gather(std::span<const float> in, std::span<float> out) override {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      throw loom::InternalError("mpi: all_gather of " + std::to_string(in.size()) + " floats into " +
                                std::to_string(out.size()) + " on " + std::to_string(size()) + " ranks");
    check_count(out.size(), "MPI_Allgather");
    const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank()) * in.size();
    process_->call([&] {
      check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()), MPI_FLOAT, out.data(),
                          static_cast<int>(in.size()), MPI_FLOAT, comm_),
            "MPI_Allgather");
    });
  }

  void broadcast(std::span<std::byte> data, int root) override {
    process_->call(
        [&] { check(MPI_Bcast(data.data(), static_cast<int>(data.size()), MPI_BYTE, root, comm_), "MPI_Bcast"); });
  }

  void barrier() override {
    process_->call([this] { check(MPI_Barrier(comm_), "MPI_Barrier"); });
  }

  std::unique_ptr<loom::CollectiveGroup::Pending> start_all_reduce(std::span<float> data) override {
    // Operations run one after the other on the communication thread, so they share its buffers.
    return std::make_unique<PendingReduce>(process_->post([this, data] { reduce(data, loom::ReduceOp::sum); }));
  }

  std::unique_ptr<loom::CollectiveGroup::Pending> start_all_gather(std::span<const float> in,
                                                                   std::span<float> out) override {
    if (out.size() != in.size() * static_cast<std::size_t>(size()))
      throw loom::InternalError("mpi: all_gather of " + std::to_string(in.size()) + " floats into " +
                                std::to_string(out.size()) + " on " + std::to_string(size()) + " ranks");
    check_count(out.size(), "MPI_Allgather");
    const bool in_place = in.data() == out.data() + static_cast<std::size_t>(rank()) * in.size();
    return std::make_unique<PendingReduce>(process_->post([this, in, out, in_place] {
      check(MPI_Allgather(in_place ? MPI_IN_PLACE : in.data(), static_cast<int>(in.size()), MPI_FLOAT, out.data(),
                          static_cast<int>(in.size()), MPI_FLOAT, comm_),
            "MPI_Allgather");
    }));
  }

  std::unique_ptr<loom::CollectiveGroup::Pending> start_reduce_scatter(std::span<const float> in,
                                                                       std::span<float> out) override {
    if (in.size() != out.size() * static_cast<std::size_t>(size()))
      throw loom::InternalError("mpi: reduce_scatter of " + std::to_string(in.size()) + " floats into " +
                                std::to_string(out.size()) + " per rank on " + std::to_string(size()) + " ranks");
    return std::make_unique<PendingReduce>(
        process_->post([this, in, out] { scatter_reduce(in.data(), out.data(), out.size(), loom::ReduceOp::sum); }));
  }

 protected:
  class PendingReduce final : public loom::CollectiveGroup::Pending {
   public:
    explicit PendingReduce(std::future<void> done) : done_(std::move(done)) {}
    ~PendingReduce() override {
      if (done_.valid()) done_.wait();
    }
    void wait() override {
      if (done_.valid()) done_.get();
    }

   private:
    std::future<void> done_;
  };

  static void check(int rc, const char* operation) {
    if (rc == MPI_SUCCESS) return;
    int rank = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    throw loom::Error(loom::ErrorKind::internal, std::string("mpi: ") + operation + " failed on rank " +
                                                     std::to_string(rank) + ": " + mpi_error_text(rc));
  }

  // MPI counts and displacements are ints.
  static void check_count(std::size_t elements, const char* operation) {
    if (elements > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw loom::InternalError(std::string("mpi: ") + operation + " of " + std::to_string(elements) +
                                " elements: more than MPI's int counts address");
  }

  // On the communication thread: `in` holds size() chunks of `chunk` elements; `out` receives the
  // reduction over the ranks of chunk rank(), in rank order. `out` may be that chunk of `in` (in
  // place). Piece by piece: each piece's all-to-all hands this rank every rank's copy of it in a
  // scratch of at most kScratchBytes, so the memory the reduction takes stays small whatever the
  // buffer's size (a scratch of the whole buffer would cost a ZeRO-1 run more than its sharded
  // optimizer state saves).
  template <class T>
  void scatter_reduce(const T* in, T* out, std::size_t chunk, loom::ReduceOp op) {
    const std::size_t ranks = static_cast<std::size_t>(size());
    check_count(chunk * ranks, "MPI_Alltoallv");
    const std::size_t piece =
        std::clamp<std::size_t>(kScratchBytes / sizeof(T) / ranks, 1, std::max<std::size_t>(chunk, 1));
    std::vector<T>& scratch = buffers<T>().received;
    scratch.resize(piece * ranks);
    std::vector<int> counts(ranks), send_at(ranks), receive_at(ranks);
    for (std::size_t at = 0; at < chunk; at += piece) {
      const std::size_t n = std::min(piece, chunk - at);
      for (std::size_t r = 0; r < ranks; ++r) {
        counts[r] = static_cast<int>(n);
        send_at[r] = static_cast<int>(r * chunk + at);
        receive_at[r] = static_cast<int>(r * n);
      }
      check(MPI_Alltoallv(in, counts.data(), send_at.data(), mpi_type<T>(), scratch.data(), counts.data(),
                          receive_at.data(), mpi_type<T>(), comm_),
            "MPI_Alltoallv");
      T* sum = out + at;
      std::copy(scratch.data(), scratch.data() + n, sum);
      for (std::size_t r = 1; r < ranks; ++r) {
        const T* from = scratch.data() + r * n;
        for (std::size_t i = 0; i < n; ++i) {
          switch (op) {
            case loom::ReduceOp::sum:
              sum[i] += from[i];
              break;
            case loom::ReduceOp::max:
              sum[i] = std::max(sum[i], from[i]);
              break;
            case loom::ReduceOp::min:
              sum[i] = std::min(sum[i], from[i]);
              break;
          }
        }
      }
    }
  }

  // On the communication thread: the scattered reduction of `data`, in place, then an all-gather
  // of the reduced chunks. The whole multiple of size() goes in place; the last size() - 1
  // elements at most, padded, in a second round (each element is still summed in rank order).
  template <class T>
  void reduce(std::span<T> data, loom::ReduceOp op) {
    const std::size_t ranks = static_cast<std::size_t>(size());
    if (ranks == 1 || data.empty()) return;
    const std::size_t whole = data.size() / ranks * ranks;
    if (whole > 0) reduce_in_place(data.data(), whole / ranks, op);
    if (whole == data.size()) return;
    std::vector<T>& tail = buffers<T>().padded;
    tail.assign(ranks, T{});
    std::copy(data.begin() + static_cast<std::ptrdiff_t>(whole), data.end(), tail.begin());
    reduce_in_place(tail.data(), 1, op);
    std::copy(tail.begin(), tail.begin() + static_cast<std::ptrdiff_t>(data.size() - whole),
              data.begin() + static_cast<std::ptrdiff_t>(whole));
  }

  template <class T>
  void reduce_in_place(T* data, std::size_t chunk, loom::ReduceOp op) {
    check_count(chunk * static_cast<std::size_t>(size()), "MPI_Allgather");
    scatter_reduce(data, data + chunk * static_cast<std::size_t>(rank()), chunk, op);
    check(MPI_Allgather(MPI_IN_PLACE, static_cast<int>(chunk), mpi_type<T>(), data, static_cast<int>(chunk),
                        mpi_type<T>(), comm_),
          "MPI_Allgather");
  }

  // Kept between operations (a step reduces the same sizes every time): no allocation per step.
  // `padded`: an all-reduce's last elements; `received`: every rank's copy of one piece.
  template <class T>
  struct Buffers {
    std::vector<T> padded, received;
  };
  template <class T>
  Buffers<T>& buffers() {
    if constexpr (std::is_same_v<T, float>)
      return float_buffers_;
    else
      return double_buffers_;
  }

  // The all-to-all scratch of scatter_reduce(): every rank's copy of one piece.
  static constexpr std::size_t kScratchBytes = std::size_t{8} << 20;

  std::shared_ptr<MpiProcess> process_;
  MPI_Comm comm_;
  int rank_, size_;
  Buffers<float> float_buffers_;
  Buffers<double> double_buffers_;
};

class MpiGroup final : public MpiCommunicator<loom::CollectiveGroup> {
 public:
  using MpiCommunicator::MpiCommunicator;
  ~MpiGroup() override {
    // Unwinding from an error: the communication thread may be stuck in an operation a dead
    // peer never joins (see ~MpiProcess); the process is about to exit, leave the communicator.
    if (std::uncaught_exceptions() > 0) return;
    try {
      process_->call([this] { MPI_Comm_free(&comm_); });
    } catch (...) {
    }
  }
};

class MpiCollective final : public MpiCommunicator<loom::Collective> {
 public:
  MpiCollective() : MpiCollective(mpi_process()) {}

  std::string describe() const override { return process_->describe(); }

  std::shared_ptr<loom::CollectiveGroup> split(int color, int key) override {
    if (color < 0) throw loom::InternalError("mpi: split with colour " + std::to_string(color) + " (must be >= 0)");
    MPI_Comm comm = MPI_COMM_NULL;
    int group_rank = 0, group_size = 0;
    process_->call([&] {
      check(MPI_Comm_split(MPI_COMM_WORLD, color, key, &comm), "MPI_Comm_split");
      MPI_Comm_rank(comm, &group_rank);
      MPI_Comm_size(comm, &group_size);
    });
    return std::make_shared<MpiGroup>(process_, comm, group_rank, group_size);
  }

 private:
  explicit MpiCollective(std::shared_ptr<MpiProcess> process)
      : MpiCommunicator(process, MPI_COMM_WORLD, process->rank(), process->size()) {}
};

void register_components(loom::Registrar& registrar) {
  registrar.add<loom::Collective>(
      {.name = "mpi",
       .description = "the ranks of an mpirun job, over OpenMPI (picked by itself under mpirun)",
       .version = "1.1.0"},
      [](const loom::Options&, const loom::CreateContext&) { return std::make_unique<MpiCollective>(); });
}

}  // namespace

LOOM_PLUGIN(register_components)
