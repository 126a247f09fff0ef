// tracker `tensorboard`: a run's metrics as TensorBoard event files,
// <run_dir>/tensorboard/events.out.tfevents.<unix time>.<host>: TFRecord-framed Event protocol
// buffers (tfrecord.hpp, event_proto.hpp), scalars as simple values and text samples for the text
// plugin. Open with `tensorboard --logdir runs/`.
//
// Each start() writes a new file beginning with file_version "brain.Event:2" and a SessionLog
// START at the run's start step, so that when a run resumes TensorBoard drops what the previous
// part logged at or past that step (its EventAccumulator purges on START), and then the resolved
// config as a text sample.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <loom/kinds/tracker.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <string>
#include <utility>

#include "event_proto.hpp"
#include "tfrecord.hpp"

namespace {

namespace fs = std::filesystem;
namespace tb = loom::tensorboard;

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// The resolved config as a Markdown code block (indented), which the text plugin shows verbatim.
std::string config_text(const loom::Value& config) {
  std::string out;
  const std::string yaml = config.to_yaml();
  std::size_t begin = 0;
  while (begin < yaml.size()) {
    std::size_t end = yaml.find('\n', begin);
    if (end == std::string::npos) end = yaml.size();
    out += "    " + yaml.substr(begin, end - begin) + "\n";
    begin = end + 1;
  }
  return out;
}

class TensorBoardTracker final : public loom::Tracker {
 public:
  explicit TensorBoardTracker(const loom::Options& o) : dir_name_(o.get<std::string>("dir")) {}

  ~TensorBoardTracker() override {
    if (file_) std::fclose(file_);
  }

  void start(const loom::RunInfo& run) override {
    if (file_) throw loom::InternalError("tracker 'tensorboard': start() called twice");
    const fs::path dir = fs::path(run.run_dir) / dir_name_;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw loom::UserError("cannot create " + dir.string() + " (tracker 'tensorboard'): " + ec.message());
    open_new_file(dir);
    write(tb::file_version_event(wall_time(), run.start_step));
    write(tb::session_start_event(wall_time(), run.start_step));
    if (!run.config.is_null()) write(tb::text_event(wall_time(), run.start_step, "config", config_text(run.config)));
  }

  void log_scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) override {
    if (scalars.empty()) return;
    write(tb::scalars_event(wall_time(), step, scalars));
  }

  void log_text(std::int64_t step, std::string_view tag, std::string_view text) override {
    write(tb::text_event(wall_time(), step, tag, text));
  }

  void flush() override {
    if (!file_) return;
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) fail("cannot write");
  }

 private:
  // events.out.tfevents.<10-digit unix time>.<host>, as TensorFlow names them; a suffix keeps a
  // second file started in the same second (a quick resume) from replacing the first.
  void open_new_file(const fs::path& dir) {
    const std::string base =
        "events.out.tfevents." + std::to_string(static_cast<long long>(std::time(nullptr))) + "." + host_name();
    for (int n = 0; n < 1000 && !file_; ++n) {
      path_ = dir / (n == 0 ? base : base + "." + std::to_string(n));
      file_ = std::fopen(path_.c_str(), "wbx");  // x: never an existing file
      if (!file_ && errno != EEXIST) fail("cannot create");
    }
    if (!file_) fail("cannot create");
  }

  void write(const std::string& event) {
    if (!file_) throw loom::InternalError("tracker 'tensorboard': an event was logged before start()");
    const std::string record = tb::tfrecord(event);
    // Flushed event by event so that a live TensorBoard and a crash see every completed step.
    if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
      fail("cannot write");
  }

  [[noreturn]] void fail(const char* what) const {
    throw loom::UserError(std::string(what) + " " + path_.string() +
                          " (tracker 'tensorboard'): " + std::strerror(errno));
  }

  std::string dir_name_;
  fs::path path_;
  std::FILE* file_ = nullptr;
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  options.string("dir", "tensorboard", "Directory in the run directory that receives the event files.");
  registrar.add<loom::Tracker>(
      {.name = "tensorboard",
       .description = "TensorBoard event files (scalars, text samples) in <run_dir>/tensorboard",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<TensorBoardTracker>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
