// tracker `jsonl`: a run's metrics as JSON lines, <run_dir>/metrics.jsonl, one object per logged
// step: {"step": 100, "train/loss": 2.31, "train/lr": 0.0006, ...}.
//
// Everything logged for one step (training scalars, eval results, a text sample) goes into that
// step's one object, which is written when the next step is logged, at flush(), or at the end.
// A resumed run first drops the records of steps at or past its start step, which the previous
// part of the run wrote after its last checkpoint, so no step appears twice.
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <loom/kinds/tracker.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>

namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string system_error(const std::string& what, const fs::path& path) {
  return what + " " + path.string() + ": " + std::strerror(errno);
}

// The records of `path` whose step is before `start_step`, as lines. A line that is not a JSON
// object with an integer "step" (the torn last line of a run that was killed) is dropped.
std::string records_before(const fs::path& path, std::int64_t start_step) {
  std::ifstream in(path);
  if (!in) throw loom::UserError(system_error("cannot read", path));
  std::string kept, line;
  while (std::getline(in, line)) {
    const Json record = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!record.is_object()) continue;
    const auto step = record.find("step");
    if (step == record.end() || !step->is_number_integer()) continue;
    if (step->get<std::int64_t>() < start_step) kept += line + "\n";
  }
  return kept;
}

// Replaces `path` by `text` atomically (write beside it, then rename), so a crash leaves either
// the old file or the new one.
void replace_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw loom::UserError(system_error("cannot write", tmp));
    out << text;
    out.flush();
    if (!out) throw loom::UserError(system_error("cannot write", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw loom::UserError("cannot replace " + path.string() + ": " + ec.message());
}

class JsonlTracker final : public loom::Tracker {
 public:
  explicit JsonlTracker(const loom::Options& o) : file_name_(o.get<std::string>("file")) {}

  ~JsonlTracker() override {
    // Nothing may escape a destructor; flush() is where write errors are reported.
    try {
      write_pending();
    } catch (...) {
    }
    if (file_) std::fclose(file_);
  }

  void start(const loom::RunInfo& run) override {
    if (file_) throw loom::InternalError("tracker 'jsonl': start() called twice");
    path_ = fs::path(run.run_dir) / file_name_;
    std::error_code ec;
    if (fs::exists(path_, ec)) replace_file(path_, records_before(path_, run.start_step));
    file_ = std::fopen(path_.c_str(), "ab");
    if (!file_) throw loom::UserError(system_error("cannot open", path_) + " (tracker 'jsonl', the run's metrics)");
  }

  void log_scalars(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) override {
    Json& r = record(step);
    // JSON has no NaN or infinity: those are written as null.
    for (const auto& [name, value] : scalars) r[checked_key(name)] = std::isfinite(value) ? Json(value) : Json();
  }

  void log_text(std::int64_t step, std::string_view tag, std::string_view text) override {
    record(step)[checked_key(std::string(tag))] = std::string(text);
  }

  void flush() override {
    if (!file_) return;
    write_pending();
    if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0)
      throw loom::UserError(system_error("cannot write", path_));
  }

 private:
  static const std::string& checked_key(const std::string& key) {
    if (key == "step") throw loom::InternalError("tracker 'jsonl': a metric may not be called \"step\"");
    return key;
  }

  // The pending record of `step`, after writing the previous step's.
  Json& record(std::int64_t step) {
    if (!file_) throw loom::InternalError("tracker 'jsonl': a metric was logged before start()");
    if (pending_step_ != step) {
      write_pending();
      pending_ = Json::object();
      pending_["step"] = step;
      pending_step_ = step;
    }
    return pending_;
  }

  void write_pending() {
    if (!pending_step_ || !file_) return;
    // Text samples of byte-level models may be invalid UTF-8: replace what is not, never throw.
    const std::string line = pending_.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    pending_step_.reset();
    // Flushed line by line so that `tail -f` and a crash see every completed step.
    if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
      throw loom::UserError(system_error("cannot write", path_));
  }

  std::string file_name_;
  fs::path path_;
  std::FILE* file_ = nullptr;
  Json pending_;
  std::optional<std::int64_t> pending_step_;
};

void register_components(loom::Registrar& registrar) {
  loom::OptionSchema options;
  options.string("file", "metrics.jsonl", "File in the run directory that receives one JSON object per logged step.");
  registrar.add<loom::Tracker>(
      {.name = "jsonl",
       .description = "metrics as JSON lines in the run directory (metrics.jsonl), one object per step",
       .version = "1.0.0",
       .options = std::move(options)},
      [](const loom::Options& o, const loom::CreateContext&) { return std::make_unique<JsonlTracker>(o); });
}

}  // namespace

LOOM_PLUGIN(register_components)
