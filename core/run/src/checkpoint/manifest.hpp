// manifest.json: the list of a checkpoint's files with the size and CRC-32C of each, written
// last into the checkpoint (before it is committed), so that a checkpoint can be verified in
// full before anything is loaded from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace loom::checkpoint {

struct ManifestEntry {
  std::string name;  // a file directly inside the checkpoint directory
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

// The ranks that wrote a checkpoint: the mesh's axes with their sizes, outermost first
// ({"data", 2}, {"fsdp", 1}); empty for one process.
using MeshSizes = std::vector<std::pair<std::string, int>>;

// "data 1 x fsdp 2", or "1 rank" for an empty mesh.
std::string describe_mesh(const MeshSizes& mesh);

struct Manifest {
  std::int64_t step = 0;
  std::vector<ManifestEntry> files;  // sorted by name
  MeshSizes mesh;                    // the run's mesh (empty: one process)
  // 0: the tensors are in model.safetensors and optimizer.safetensors (format version 1);
  // N: each of N ranks wrote model.rank-<r>-of-<N>.safetensors and optimizer.rank-...
  // (version 2: sharded_checkpoint.hpp).
  int shards = 0;
};

// The files every checkpoint holds (others, such as tokenizer.state, are listed when present):
// of an unsharded one, and of one whose tensors `shards` ranks wrote.
const std::vector<std::string>& required_files();
std::vector<std::string> required_files(int shards);
// "model.rank-00001-of-00004.safetensors": rank `rank`'s file of tensor group `group` ("model",
// "optimizer") in a checkpoint that `shards` ranks wrote.
std::string rank_file_name(std::string_view group, int rank, int shards);

// Checksums every regular file of `dir` (manifest.json excepted) into a manifest for `step`.
Manifest describe_directory(const std::filesystem::path& dir, std::int64_t step);

std::string to_json(const Manifest& manifest);
// Throws UserError (what is wrong with the text) when `text` is not a manifest loom writes.
Manifest parse_manifest(const std::string& text);

// The outcome of verifying a checkpoint directory.
struct Verification {
  bool ok = false;
  std::string file;         // the file at fault ("" when ok)
  std::string problem;      // what is wrong with it, e.g. "is truncated: 100 of 4096 bytes"
  std::uint64_t bytes = 0;  // the listed files' total size (0 when the manifest is unreadable)
  std::int64_t step = -1;   // the manifest's step, when it parses
  MeshSizes mesh;           // and the mesh and shards it records
  int shards = 0;

  // "'<dir>/model.safetensors' is truncated: 100 of 4096 bytes".
  std::string describe(const std::filesystem::path& dir) const;
};

// Verifies `dir` against its manifest.json: the manifest parses, names its step and every
// required file, and each listed file exists with the listed size and CRC-32C. Reads every byte;
// loads nothing.
Verification verify_checkpoint(const std::filesystem::path& dir);

}  // namespace loom::checkpoint
