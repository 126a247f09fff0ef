#include "checkpoint/manifest.hpp"

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "checkpoint/crc32c.hpp"
#include "checkpoint/durable_io.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {

namespace {

constexpr const char* kFormat = "loom-checkpoint";
// Version 1: one process's (or rank 0's) model.safetensors and optimizer.safetensors; version 2:
// every rank's shard files (sharded_checkpoint.hpp). A loom that reads only 1 refuses 2 by its
// number rather than by a missing file.
constexpr int kVersion = 1;
constexpr int kShardedVersion = 2;

std::string hex32(std::uint32_t x) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", x);
  return buf;
}

std::string format_bytes(std::uint64_t n) {
  return std::to_string(n) + (n == 1 ? " byte" : " bytes");
}

}  // namespace

const std::vector<std::string>& required_files() {
  static const std::vector<std::string> files = {"config.yaml", "model.safetensors", "optimizer.safetensors",
                                                 "state.json"};
  return files;
}

std::vector<std::string> required_files(int shards) {
  if (shards == 0) return required_files();
  std::vector<std::string> files = {"config.yaml", "state.json"};
  for (int r = 0; r < shards; ++r)
    for (const char* group : {"model", "optimizer"}) files.push_back(rank_file_name(group, r, shards));
  return files;
}

std::string rank_file_name(std::string_view group, int rank, int shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".rank-%05d-of-%05d.safetensors", rank, shards);
  return std::string(group) + buf;
}

std::string describe_mesh(const MeshSizes& mesh) {
  if (mesh.empty()) return "1 rank";
  std::string out;
  for (const auto& [axis, size] : mesh) out += (out.empty() ? "" : " x ") + axis + " " + std::to_string(size);
  return out;
}

Manifest describe_directory(const fs::path& dir, std::int64_t step) {
  Manifest m;
  m.step = step;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string name = entry.path().filename().string();
    if (name == "manifest.json") continue;
    const FileChecksum sum = checksum_file(entry.path());
    m.files.push_back({name, sum.size, sum.crc32c});
  }
  std::sort(m.files.begin(), m.files.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return m;
}

std::string to_json(const Manifest& manifest) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["version"] = manifest.shards > 0 ? kShardedVersion : kVersion;
  j["step"] = manifest.step;
  // Optional in version 1 (a data-parallel run's rank 0 wrote it; an older loom ignores the key).
  if (!manifest.mesh.empty()) {
    nlohmann::ordered_json mesh = nlohmann::ordered_json::object();
    for (const auto& [axis, size] : manifest.mesh) mesh[axis] = size;
    j["mesh"] = std::move(mesh);
  }
  if (manifest.shards > 0) j["shards"] = manifest.shards;
  j["files"] = nlohmann::ordered_json::array();
  for (const auto& f : manifest.files)
    j["files"].push_back({{"name", f.name}, {"size", f.size}, {"crc32c", hex32(f.crc32c)}});
  return j.dump(2) + "\n";
}

Manifest parse_manifest(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw UserError("is not valid JSON");
  if (!j.is_object() || j.value("format", "") != kFormat)
    throw UserError("is not a loom checkpoint manifest (no \"format\": \"" + std::string(kFormat) + "\")");
  const int version = j.contains("version") && j["version"].is_number_integer() ? j["version"].get<int>() : -1;
  if (version != kVersion && version != kShardedVersion)
    throw UserError("has a version this loom does not read (expected " + std::to_string(kVersion) + " or " +
                    std::to_string(kShardedVersion) + ")");
  if (!j.contains("step") || !j["step"].is_number_integer()) throw UserError("has no integer \"step\"");
  if (!j.contains("files") || !j["files"].is_array()) throw UserError("has no \"files\" list");
  Manifest m;
  m.step = j["step"].get<std::int64_t>();
  if (j.contains("mesh")) {
    if (!j["mesh"].is_object()) throw UserError("has a \"mesh\" that is not an object of axis sizes");
    for (const auto& [axis, size] : j["mesh"].items()) {
      if (!size.is_number_integer() || size.get<int>() < 1)
        throw UserError("gives mesh axis '" + axis + "' a size that is not a positive integer");
      m.mesh.emplace_back(axis, size.get<int>());
    }
  }
  if (version == kShardedVersion) {
    if (!j.contains("shards") || !j["shards"].is_number_integer() || j["shards"].get<int>() < 1)
      throw UserError("is a sharded checkpoint's (version 2) without a positive integer \"shards\"");
    m.shards = j["shards"].get<int>();
  }
  for (const auto& f : j["files"]) {
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string() || !f.contains("size") ||
        !f["size"].is_number_unsigned() || !f.contains("crc32c") || !f["crc32c"].is_string())
      throw UserError("has a file entry without a string \"name\", an unsigned \"size\" and a hex \"crc32c\"");
    const std::string name = f["name"].get<std::string>();
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw UserError("lists '" + name + "', which is not a file name");
    const std::string crc = f["crc32c"].get<std::string>();
    if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw UserError("gives '" + crc + "' as the CRC-32C of " + name + " (expected 8 hex digits)");
    m.files.push_back({name, f["size"].get<std::uint64_t>(), static_cast<std::uint32_t>(std::stoul(crc, nullptr, 16))});
  }
  return m;
}

std::string Verification::describe(const fs::path& dir) const {
  if (ok) return "'" + dir.string() + "' verifies";
  return "'" + (dir / file).string() + "' " + problem;
}

Verification verify_checkpoint(const fs::path& dir) {
  Verification v;
  auto fail = [&](std::string file, std::string problem) {
    v.ok = false;
    v.file = std::move(file);
    v.problem = std::move(problem);
    return v;
  };
  std::error_code ec;
  const fs::path manifest_path = dir / "manifest.json";
  if (!fs::exists(manifest_path, ec))
    return fail("manifest.json", "is missing (the checkpoint was not written completely)");
  Manifest m;
  try {
    m = parse_manifest(read_whole(manifest_path));
  } catch (const UserError& e) {
    return fail("manifest.json", e.what());
  }
  v.step = m.step;
  v.mesh = m.mesh;
  v.shards = m.shards;
  for (const auto& f : m.files) v.bytes += f.size;
  for (const auto& required : required_files(m.shards))
    if (std::none_of(m.files.begin(), m.files.end(), [&](const auto& f) { return f.name == required; }))
      return fail("manifest.json", "does not list " + required + ", which every checkpoint holds");
  for (const auto& f : m.files) {
    const fs::path path = dir / f.name;
    const auto status = fs::status(path, ec);
    if (!fs::exists(status)) return fail(f.name, "is missing (the manifest lists it)");
    if (!fs::is_regular_file(status)) return fail(f.name, "is not a regular file");
    const std::uint64_t size = fs::file_size(path, ec);
    if (ec) return fail(f.name, "cannot be read: " + ec.message());
    if (size < f.size)
      return fail(f.name,
                  "is truncated: " + format_bytes(size) + " of the " + format_bytes(f.size) + " the manifest lists");
    if (size > f.size)
      return fail(f.name,
                  "is longer than the manifest says: " + format_bytes(size) + ", listed as " + format_bytes(f.size));
    FileChecksum sum;
    try {
      sum = checksum_file(path);
    } catch (const UserError& e) {
      return fail(f.name, std::string("cannot be read: ") + e.what());
    }
    if (sum.size != f.size)
      return fail(f.name,
                  "changed while it was read (" + format_bytes(sum.size) + ", listed as " + format_bytes(f.size) + ")");
    if (sum.crc32c != f.crc32c)
      return fail(f.name, "fails its CRC-32C check (its bytes give " + hex32(sum.crc32c) + ", the manifest lists " +
                              hex32(f.crc32c) + "): the file is corrupt");
  }
  v.ok = true;
  return v;
}

}  // namespace loom::checkpoint
