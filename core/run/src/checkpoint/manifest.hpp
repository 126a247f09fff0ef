// manifest.json: the list of a checkpoint's files with the size and CRC-32C of each, written
// last into the checkpoint (before it is committed), so that a checkpoint can be verified in
// full before anything is loaded from it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace loom::checkpoint {

struct ManifestEntry {
  std::string name;  // a file directly inside the checkpoint directory
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

struct Manifest {
  std::int64_t step = 0;
  std::vector<ManifestEntry> files;  // sorted by name
};

// The files every checkpoint holds (others, such as tokenizer.state, are listed when present).
const std::vector<std::string>& required_files();

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

  // "'<dir>/model.safetensors' is truncated: 100 of 4096 bytes".
  std::string describe(const std::filesystem::path& dir) const;
};

// Verifies `dir` against its manifest.json: the manifest parses, names its step and every
// required file, and each listed file exists with the listed size and CRC-32C. Reads every byte;
// loads nothing.
Verification verify_checkpoint(const std::filesystem::path& dir);

}  // namespace loom::checkpoint
