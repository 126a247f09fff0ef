// CRC-32C (Castagnoli), the checksum of every file a checkpoint's manifest lists: the one
// iSCSI, ext4 and Google's storage use, with a CPU instruction on x86-64 (SSE 4.2) that this
// code uses when the processor has it, and a table-driven fallback that gives the same values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

namespace loom::checkpoint {

// Extends `crc` (0 to start) over `size` bytes. crc32c(0, "123456789", 9) == 0xe3069283.
std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t size);

struct FileChecksum {
  std::uint64_t size = 0;
  std::uint32_t crc32c = 0;
};

// The size and CRC-32C of a file's contents, read in blocks. Throws UserError when it cannot be
// read.
FileChecksum checksum_file(const std::filesystem::path& path);

}  // namespace loom::checkpoint
