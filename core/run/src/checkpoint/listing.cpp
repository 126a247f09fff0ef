// `loom checkpoints`: see loom/run/checkpoints.hpp.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/core/config.hpp"
#include "loom/error.hpp"
#include "loom/run/checkpoints.hpp"

namespace fs = std::filesystem;

namespace loom {

namespace {

using checkpoint::CheckpointStore;

bool has_step_dirs(const fs::path& dir) {
  return !CheckpointStore(dir).list().empty();
}

fs::path checkpoint_dir_of(const fs::path& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec)) throw UserError("'" + path.string() + "' is not a directory");
  if (fs::exists(path / "latest", ec) || has_step_dirs(path) || !CheckpointStore(path).list_set_aside().empty())
    return path;
  // A run whose config puts its checkpoints elsewhere (trainer.checkpoint.dir).
  if (fs::exists(path / "config.yaml", ec)) {
    const Value config = config::load_file(path / "config.yaml");
    const Value* dir = config.at_path("trainer.checkpoint.dir");
    if (dir && dir->is_string() && !dir->as_string().empty()) return dir->as_string();
  }
  if (fs::is_directory(path / "checkpoints", ec)) return path / "checkpoints";
  throw UserError("'" + path.string() +
                  "' has no checkpoints: it is neither a run directory with a checkpoints/ directory nor a "
                  "checkpoint directory (a run saves them by trainer.checkpoint's policies, see docs/checkpoints.md)");
}

std::string modification_time(const fs::path& path) {
  std::error_code ec;
  const auto t = fs::last_write_time(path, ec);
  if (ec) return "?";
  const auto system = std::chrono::time_point_cast<std::chrono::system_clock::duration>(
      t - fs::file_time_type::clock::now() + std::chrono::system_clock::now());
  const std::time_t tt = std::chrono::system_clock::to_time_t(system);
  std::tm tm{};
  gmtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string size_text(std::uint64_t bytes) {
  std::ostringstream os;
  const double b = static_cast<double>(bytes);
  os << std::fixed;
  if (b >= 1e9)
    os << std::setprecision(2) << b / 1e9 << " GB";
  else if (b >= 1e6)
    os << std::setprecision(1) << b / 1e6 << " MB";
  else if (b >= 1e3)
    os << std::setprecision(0) << b / 1e3 << " kB";
  else
    os << bytes << " B";
  return os.str();
}

}  // namespace

CheckpointsReport list_checkpoints(const fs::path& path) {
  CheckpointsReport report;
  report.dir = checkpoint_dir_of(path);
  const CheckpointStore store(report.dir);
  const auto latest = store.latest();
  for (const auto& c : store.list()) {
    CheckpointListing l;
    l.step = c.step;
    l.path = c.path;
    l.latest = latest == c.step;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(c.path, ec))
      if (entry.is_regular_file(ec)) l.bytes += entry.file_size(ec);
    const checkpoint::Verification v = checkpoint::verify_checkpoint(c.path);
    l.verifies = v.ok && v.step == c.step;
    if (v.step >= 0) l.mesh = checkpoint::describe_mesh(v.mesh);
    if (!v.ok)
      l.problem = v.file + " " + v.problem;
    else if (v.step != c.step)
      l.problem = "its manifest is for step " + std::to_string(v.step);
    l.saved_at = modification_time(c.path);
    try {
      l.saved_at = checkpoint::parse_train_record(checkpoint::read_whole(c.path / "state.json")).saved_at;
    } catch (const UserError&) {
    }
    report.checkpoints.push_back(std::move(l));
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(report.dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(".tmp-step-", 0) == 0 || name.rfind(".deleting-", 0) == 0) report.leftovers.push_back(name);
  }
  std::sort(report.leftovers.begin(), report.leftovers.end());
  for (const auto& p : store.list_set_aside()) report.set_aside.push_back(p.filename().string());
  return report;
}

void print_checkpoints(std::ostream& out, const CheckpointsReport& report) {
  out << "checkpoints in " << report.dir.string() << ":\n";
  // The mesh column as wide as its longest entry ("data 2 x fsdp 2 x tensor 2"), and 3 apart.
  std::size_t mesh_width = std::string("written on").size();
  for (const auto& c : report.checkpoints) mesh_width = std::max(mesh_width, c.mesh.size());
  const int mesh_column = static_cast<int>(mesh_width) + 3;
  if (report.checkpoints.empty())
    out << "  (none)\n";
  else
    out << "  " << std::left << std::setw(10) << "step" << std::setw(22) << "saved (UTC)" << std::setw(11) << "size"
        << std::setw(mesh_column) << "written on"
        << "verifies\n";
  for (const auto& c : report.checkpoints) {
    out << "  " << std::left << std::setw(10) << ("step-" + std::to_string(c.step)) << std::setw(22) << c.saved_at
        << std::setw(11) << size_text(c.bytes) << std::setw(mesh_column) << c.mesh
        << (c.verifies ? "yes" : "NO: " + c.problem) << (c.latest ? "  (latest)" : "") << "\n";
  }
  for (const auto& l : report.leftovers)
    out << "  " << l << ": left by an interrupted write or deletion (removed when the run next starts)\n";
  for (const auto& a : report.set_aside)
    out << "  " << a
        << ": moved aside by loom, which found it unusable; never resumed from nor deleted by loom (inspect or "
           "repair it, then remove it yourself)\n";
}

}  // namespace loom
