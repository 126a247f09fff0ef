#include "checkpoint/checkpoint_store.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <thread>

#include "checkpoint/durable_io.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {

namespace {

constexpr const char* kLatest = "latest";

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS: a pause after each stage of a commit, so that a test that
// kills `loom train` from outside can land inside a checkpoint write. Not for production use.
// (This and LOOM_TEST_CHECKPOINT_KILL act inside a commit, in a process the test reaches only from
// outside: the `loom` command, a rank of mpirun. What acts between steps is a hook
// (Trainer::add_hook); in process, set_stage_hook observes the stages.)
int test_stage_delay_ms() {
  static const int ms = [] {
    const char* v = std::getenv("LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS");
    return v ? std::atoi(v) : 0;
  }();
  return ms;
}

// "20261124-210211Z": when a checkpoint was moved aside, in its new name (UTC).
std::string utc_stamp() {
  return utc_time("%Y%m%d-%H%M%SZ");
}

constexpr const char* kSetAside = ".unusable-";

// LOOM_TEST_CHECKPOINT_KILL=<rank>:<stage>:<step>: the process of that rank kills itself with
// SIGKILL once it has reached that stage (stage_name) of checkpoint <step>, so that a test can
// end one rank of an mpirun between its files and the commit. Not for production use.
struct KillPoint {
  int rank = -1;
  std::string stage;
  std::int64_t step = -1;
};
const KillPoint& test_kill_point() {
  static const KillPoint point = [] {
    KillPoint k;
    const char* v = std::getenv("LOOM_TEST_CHECKPOINT_KILL");
    if (!v) return k;
    const std::string text = v;
    const auto a = text.find(':'), b = text.rfind(':');
    if (a == std::string::npos || b == a) return k;
    k.rank = std::atoi(text.substr(0, a).c_str());
    k.stage = text.substr(a + 1, b - a - 1);
    k.step = std::atoll(text.substr(b + 1).c_str());
    return k;
  }();
  return point;
}

}  // namespace

const char* stage_name(CommitStage stage) {
  switch (stage) {
    case CommitStage::temp_created:
      return "temp_created";
    case CommitStage::files_written:
      return "files_written";
    case CommitStage::manifest_written:
      return "manifest_written";
    case CommitStage::renamed:
      return "renamed";
    case CommitStage::latest_replaced:
      return "latest_replaced";
    case CommitStage::retention_done:
      return "retention_done";
  }
  return "?";
}

CheckpointStore::CheckpointStore(fs::path dir, Retention retention) : dir_(std::move(dir)), retention_(retention) {
  if (retention_.keep_last < 1) throw InternalError("checkpoint retention: keep_last must be >= 1");
  if (const int ms = test_stage_delay_ms(); ms > 0)
    stage_hook_ = [ms](CommitStage) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); };
}

std::string CheckpointStore::dir_name(std::int64_t step) {
  return "step-" + std::to_string(step);
}

std::optional<std::int64_t> CheckpointStore::parse_dir_name(const std::string& name) {
  if (!starts_with(name, "step-") || name.size() == 5) return std::nullopt;
  std::int64_t step = 0;
  const char* begin = name.data() + 5;
  const char* end = name.data() + name.size();
  const auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end || step < 0 || (name.size() > 6 && name[5] == '0')) return std::nullopt;
  return step;
}

std::vector<CheckpointDir> CheckpointStore::list() const {
  std::vector<CheckpointDir> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    if (!entry.is_directory(ec)) continue;
    if (const auto step = parse_dir_name(entry.path().filename().string())) out.push_back({*step, entry.path()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

bool CheckpointStore::is_set_aside_name(const std::string& name) {
  const auto at = name.find(kSetAside);
  return at != std::string::npos && parse_dir_name(name.substr(0, at)).has_value();
}

std::vector<fs::path> CheckpointStore::list_set_aside() const {
  std::vector<fs::path> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& entry : fs::directory_iterator(dir_, ec))
    if (entry.is_directory(ec) && is_set_aside_name(entry.path().filename().string())) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

bool CheckpointStore::verifies(const CheckpointDir& checkpoint, std::string* problem) const {
  const Verification v = verify_checkpoint(checkpoint.path);
  if (v.ok && v.step == checkpoint.step) {
    verified_.insert(checkpoint.step);
    return true;
  }
  if (problem) *problem = v.ok ? "its manifest is for step " + std::to_string(v.step) : v.describe(checkpoint.path);
  return false;
}

SetAside CheckpointStore::set_aside(const CheckpointDir& checkpoint, std::string problem) const {
  verified_.erase(checkpoint.step);
  const std::string base = checkpoint.path.filename().string() + kSetAside + utc_stamp();
  fs::path to = dir_ / base;
  std::error_code ec;
  for (int i = 2; fs::exists(to, ec); ++i) to = dir_ / (base + "-" + std::to_string(i));
  if (::rename(checkpoint.path.c_str(), to.c_str()) != 0)
    throw UserError("cannot move the unusable checkpoint '" + checkpoint.path.string() + "' aside to '" + to.string() +
                    "': " + std::strerror(errno));
  sync_path(dir_);
  return {checkpoint.step, checkpoint.path, to, std::move(problem)};
}

std::optional<std::int64_t> CheckpointStore::latest() const {
  std::error_code ec;
  if (!fs::exists(dir_ / kLatest, ec)) return std::nullopt;
  std::string text;
  try {
    text = read_whole(dir_ / kLatest);
  } catch (const UserError&) {
    return std::nullopt;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  return parse_dir_name(text);
}

LatestValid CheckpointStore::find_latest_valid() const {
  LatestValid result;
  std::vector<CheckpointDir> candidates = list();
  const std::optional<std::int64_t> pointer = latest();
  std::error_code ec;
  if (pointer) {
    // Directories past `latest` were never committed (a crash between the rename and the pointer).
    std::erase_if(candidates, [&](const CheckpointDir& c) { return c.step > *pointer; });
    if (candidates.empty() || candidates.back().step != *pointer)
      result.warnings.push_back("'" + (dir_ / kLatest).string() + "' names " + dir_name(*pointer) +
                                ", which does not exist");
  } else if (fs::exists(dir_ / kLatest, ec)) {
    result.warnings.push_back("'" + (dir_ / kLatest).string() + "' does not name a step-N directory");
  }
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    std::string problem;
    if (verifies(*it, &problem)) {
      result.checkpoint = *it;
      return result;
    }
    result.warnings.push_back("checkpoint " + it->path.string() + " is unusable: " + problem);
  }
  return result;
}

void CheckpointStore::reached(CommitStage s, std::int64_t step) const {
  if (stage_hook_) stage_hook_(s);
  const KillPoint& kill = test_kill_point();
  if (kill.rank == rank_ && kill.step == step && kill.stage == stage_name(s)) ::raise(SIGKILL);
}

CommitResult CheckpointStore::commit(std::int64_t step, const std::function<void(const fs::path&)>& write_files,
                                     const MeshSizes& mesh) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw UserError("cannot create the checkpoint directory '" + dir_.string() + "': " + ec.message());
  const fs::path final_dir = dir_ / dir_name(step);
  if (latest() == step && fs::exists(final_dir, ec))
    throw InternalError("checkpoint " + final_dir.string() + " is already committed");
  const fs::path temp = dir_ / (".tmp-" + dir_name(step) + "-" + std::to_string(::getpid()));
  fs::remove_all(temp, ec);
  if (!fs::create_directory(temp, ec))
    throw UserError("cannot create '" + temp.string() + "': " + (ec ? ec.message() : "it exists"));
  Manifest manifest;
  try {
    reached(CommitStage::temp_created, step);
    write_files(temp);
    reached(CommitStage::files_written, step);
    manifest = describe_directory(temp, step);
    manifest.mesh = mesh;
  } catch (...) {
    fs::remove_all(temp, ec);
    throw;
  }
  return finish_commit(temp, manifest);
}

fs::path CheckpointStore::create_staging(std::int64_t step, const std::string& token) const {
  const fs::path temp = dir_ / (".tmp-" + dir_name(step) + "-" + token);
  std::error_code ec;
  fs::create_directories(temp, ec);
  if (ec) throw UserError("cannot create '" + temp.string() + "': " + ec.message());
  return temp;
}

CommitResult CheckpointStore::commit_staged(const fs::path& staging, const Manifest& manifest) {
  std::error_code ec;
  const fs::path final_dir = dir_ / dir_name(manifest.step);
  if (latest() == manifest.step && fs::exists(final_dir, ec))
    throw InternalError("checkpoint " + final_dir.string() + " is already committed");
  try {
    for (const auto& f : manifest.files) {
      const std::uint64_t size = fs::file_size(staging / f.name, ec);
      if (ec || size != f.size)
        throw UserError(
            "'" + (staging / f.name).string() + "', written by another rank, is " +
            (ec ? std::string("not there") : "of " + std::to_string(size) + " bytes, not " + std::to_string(f.size)) +
            " as seen from rank 0: every rank must write the checkpoints into the same directory (a "
            "shared file system, or one machine); trainer.checkpoint.dir names it");
    }
  } catch (...) {
    fs::remove_all(staging, ec);
    throw;
  }
  return finish_commit(staging, manifest);
}

CommitResult CheckpointStore::finish_commit(const fs::path& temp, const Manifest& manifest) {
  const std::int64_t step = manifest.step;
  std::error_code ec;
  const fs::path final_dir = dir_ / dir_name(step);
  CommitResult result;
  try {
    for (const auto& f : manifest.files) result.bytes += f.size;
    const std::string manifest_text = to_json(manifest);
    write_synced(temp / "manifest.json", manifest_text);
    result.bytes += manifest_text.size();
    sync_path(temp);
    reached(CommitStage::manifest_written, step);
    // A step directory left by an attempt whose `latest` never named it is replaced (moved
    // aside when it does not verify: loom deletes no such checkpoint).
    if (fs::exists(final_dir, ec)) {
      std::string problem;
      if (verifies({step, final_dir}, &problem))
        remove_directory(final_dir);
      else
        result.set_aside.push_back(set_aside({step, final_dir}, std::move(problem)));
    }
    if (::rename(temp.c_str(), final_dir.c_str()) != 0)
      throw UserError("cannot rename '" + temp.string() + "' to '" + final_dir.string() + "': " + std::strerror(errno));
  } catch (...) {
    fs::remove_all(temp, ec);
    verified_.erase(step);
    throw;
  }
  sync_path(dir_);
  // Its checksums were computed from the bytes written (describe_directory reads them back).
  verified_.insert(step);
  reached(CommitStage::renamed, step);
  replace_atomically(dir_ / kLatest, dir_name(step) + "\n");
  reached(CommitStage::latest_replaced, step);
  result.path = final_dir;
  apply_retention(step, result);
  reached(CommitStage::retention_done, step);
  return result;
}

void CheckpointStore::apply_retention(std::int64_t newest, CommitResult& result) const {
  // Only checkpoints that verify count toward keep_last: one that has gone bad is moved aside
  // (never deleted), and an older good one is kept in its place.
  std::int64_t rolling_kept = 0;
  const std::vector<CheckpointDir> all = list();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (it->step > newest) continue;  // not this store's business: discard_after handles them
    if (it->step == newest) {
      if (!retention_.is_permanent(it->step)) ++rolling_kept;
      continue;
    }
    if (retention_.is_permanent(it->step)) continue;  // kept for good: nothing to decide
    std::string problem;
    if (!verified_.contains(it->step) && !verifies(*it, &problem)) {
      result.set_aside.push_back(set_aside(*it, std::move(problem)));
      continue;
    }
    if (rolling_kept < retention_.keep_last) {
      ++rolling_kept;
      continue;
    }
    remove_directory(it->path);
    verified_.erase(it->step);
    result.removed.push_back(it->step);
  }
  std::reverse(result.removed.begin(), result.removed.end());
  std::reverse(result.set_aside.begin(), result.set_aside.end());
}

void CheckpointStore::remove_directory(const fs::path& path) const {
  // Renamed first, so that a crash part-way through the removal leaves a name no reader takes
  // for a checkpoint.
  const fs::path doomed = dir_ / (".deleting-" + path.filename().string() + "-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (::rename(path.c_str(), doomed.c_str()) != 0)
    throw UserError("cannot remove '" + path.string() + "': " + std::strerror(errno));
  fs::remove_all(doomed, ec);
  if (ec) throw UserError("cannot remove '" + doomed.string() + "': " + ec.message());
}

void CheckpointStore::remove_leftovers() const {
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return;
  std::vector<fs::path> leftovers;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (starts_with(name, ".tmp-step-") || starts_with(name, ".deleting-") || starts_with(name, ".latest.tmp-"))
      leftovers.push_back(entry.path());
  }
  for (const auto& p : leftovers) {
    fs::remove_all(p, ec);
    if (ec) throw UserError("cannot remove '" + p.string() + "' (left by an interrupted checkpoint): " + ec.message());
  }
}

Discarded CheckpointStore::discard_after(std::int64_t step) const {
  Discarded result;
  const std::optional<std::int64_t> pointer = latest();
  std::error_code ec;
  if (pointer && *pointer > step) {
    fs::remove(dir_ / kLatest, ec);
    sync_path(dir_);
  }
  for (const auto& c : list())
    if (c.step > step) {
      std::string problem;
      if (!verifies(c, &problem)) {
        result.set_aside.push_back(set_aside(c, std::move(problem)));
        continue;
      }
      remove_directory(c.path);
      verified_.erase(c.step);
      result.removed.push_back(c.step);
    }
  return result;
}

}  // namespace loom::checkpoint
