#include "train/run_directory.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>

#include "checkpoint/durable_io.hpp"
#include "loom/error.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom::training {

namespace {

std::string now_stamp() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

// The pids a lock file names ("pids: 123 124") that are still running on this host, as "123, 124".
std::string living_holders(const fs::path& lock_path) {
  std::ifstream in(lock_path);
  std::string word, living;
  in >> word;
  if (word != "pids:") return "";
  for (long pid = 0; in >> pid;) {
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM)) continue;
    // A zombie (exited, not yet reaped) holds no lock.
    std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
    std::string line;
    std::getline(stat, line);
    const auto paren = line.rfind(')');
    if (paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z') continue;
    living += (living.empty() ? "" : ", ") + std::to_string(pid);
  }
  return living;
}

[[noreturn]] void refuse_in_use(const fs::path& dir, const fs::path& lock_path) {
  const std::string holders = living_holders(lock_path);
  throw UserError("run directory '" + dir.string() + "' is in use: another loom run is training in it (" +
                  (holders.empty() ? std::string("a process holds ") + lock_path.string() +
                                         ", on another host or without naming itself"
                                   : "pid " + holders + " hold" + (holders.find(',') == std::string::npos ? "s" : "") +
                                         " " + lock_path.string() + ": its ranks on this host") +
                  "); wait for it to finish or stop it, or choose another trainer.run_dir");
}

std::shared_ptr<int> owned_fd(int fd) {
  return std::shared_ptr<int>(new int(fd), [](int* p) {
    ::close(*p);
    delete p;
  });
}

}  // namespace

std::string config_file_text(const std::string& run_id, const Value& config) {
  return "# The resolved config of run " + run_id + " (loom config show prints the same).\n" + config.to_yaml();
}

RunDirectory RunDirectory::open(const Options& trainer, const Value& config, const std::vector<int>& peers) {
  RunDirectory dir;
  dir.run_id_ = trainer.get<std::string>("run_id");
  if (dir.run_id_.empty()) {
    const std::string& file = config.location().file;
    const std::string stem = file.empty() ? "run" : fs::path(file).stem().string();
    dir.run_id_ = stem + "-" + now_stamp();
  }
  dir.path_ = trainer.get<std::string>("run_dir");
  if (dir.path_.empty()) dir.path_ = fs::path("runs") / dir.run_id_;
  std::error_code ec;
  fs::create_directories(dir.path_, ec);
  if (ec) throw UserError("cannot create run directory '" + dir.path_.string() + "': " + ec.message());
  // The lock goes with the process: a run killed with SIGKILL leaves no stale lock behind.
  const fs::path lock_path = dir.path_ / ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot create '" + lock_path.string() + "': " + std::strerror(errno));
  dir.lock_ = owned_fd(fd);
  // Exclusive: no process of another run holds it, shared or not.
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) refuse_in_use(dir.path_, lock_path);
  std::string holders = "pids: " + std::to_string(::getpid());
  for (const int pid : peers) holders += " " + std::to_string(pid);
  holders += "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, holders.data(), holders.size(), 0) != static_cast<ssize_t>(holders.size()))
    throw UserError("cannot write '" + lock_path.string() + "': " + std::strerror(errno));
  // Then shared, so that the run's other ranks hold it too (share_lock): a second run's exclusive
  // lock fails while any of them lives.
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) refuse_in_use(dir.path_, lock_path);
  return dir;
}

void RunDirectory::share_lock(const fs::path& dir) {
  const fs::path lock_path = dir / ".lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return;  // not this host's file system
    throw UserError("cannot open '" + lock_path.string() + "': " + std::strerror(errno));
  }
  lock_ = owned_fd(fd);
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) refuse_in_use(dir, lock_path);
}

bool RunDirectory::holds_run() const {
  std::error_code ec;
  return fs::exists(path_ / "metrics.jsonl", ec) || holds_final_weights();
}

bool RunDirectory::holds_final_weights() const {
  std::error_code ec;
  return fs::exists(path_ / "model.safetensors", ec);
}

void RunDirectory::write_config(const Value& config) const {
  checkpoint::replace_atomically(path_ / "config.yaml", config_file_text(run_id_, config));
}

void RunDirectory::write_tokenizer_state(const std::string& state) const {
  if (state.empty()) return;
  std::ofstream f(path_ / "tokenizer.state", std::ios::binary);
  f << state;
  if (!f) throw UserError("cannot write '" + (path_ / "tokenizer.state").string() + "'");
}

void RunDirectory::save_weights(const std::vector<ModelParameter>& parameters, std::int64_t step, bool average) const {
  safetensors::save_parameters(
      path_ / "model.safetensors", parameters,
      {{"loom.run_id", run_id_}, {"loom.step", std::to_string(step)}, {"loom.weights", average ? "ema" : "live"}});
}

void RunDirectory::write_end(const RunEnd& end) const {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char time[32];
  std::strftime(time, sizeof time, "%Y-%m-%dT%H:%M:%SZ", &tm);
  const nlohmann::json record{{"status", end.status}, {"step", end.step},       {"num_steps", end.num_steps},
                              {"reason", end.reason}, {"message", end.message}, {"time", time},
                              {"run_id", run_id_}};
  checkpoint::replace_atomically(path_ / "end.json", record.dump(2) + "\n");
}

void RunDirectory::clear_end() const {
  std::error_code ec;
  if (fs::remove(path_ / "end.json", ec)) checkpoint::sync_path(path_);
  if (ec) throw UserError("cannot remove '" + (path_ / "end.json").string() + "': " + ec.message());
}

}  // namespace loom::training
