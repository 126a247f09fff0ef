#include "train/run_directory.hpp"

#include <ctime>
#include <fstream>

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

}  // namespace

RunDirectory RunDirectory::create(const Options& trainer, const Value& config) {
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
  if (fs::exists(dir.path_ / "metrics.jsonl", ec) || fs::exists(dir.path_ / "model.safetensors", ec))
    throw UserError("run directory '" + dir.path_.string() +
                    "' already holds a run; choose another trainer.run_dir (or trainer.run_id), or remove it");
  fs::create_directories(dir.path_, ec);
  if (ec) throw UserError("cannot create run directory '" + dir.path_.string() + "': " + ec.message());
  {
    std::ofstream f(dir.path_ / "config.yaml");
    f << "# The resolved config of run " << dir.run_id_ << " (loom config show prints the same).\n" << config.to_yaml();
    if (!f) throw UserError("cannot write '" + (dir.path_ / "config.yaml").string() + "'");
  }
  return dir;
}

void RunDirectory::write_tokenizer_state(const std::string& state) const {
  if (state.empty()) return;
  std::ofstream f(path_ / "tokenizer.state", std::ios::binary);
  f << state;
  if (!f) throw UserError("cannot write '" + (path_ / "tokenizer.state").string() + "'");
}

void RunDirectory::save_weights(const std::vector<ModelParameter>& parameters, std::int64_t step) const {
  safetensors::save_parameters(path_ / "model.safetensors", parameters,
                               {{"loom.run_id", run_id_}, {"loom.step", std::to_string(step)}});
}

}  // namespace loom::training
