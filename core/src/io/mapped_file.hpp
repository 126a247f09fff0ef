// A file mapped read-only into memory: how the core reads safetensors files and token shards, so
// that reading a tensor or a window touches only its bytes and the page cache is shared between
// processes.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <string>

namespace loom::io {

// The text of errno (or of `error`), for messages.
std::string errno_text();
std::string errno_text(int error);

class MappedFile {
 public:
  // Maps `path`. Throws UserError "<what>: <reason>" when it cannot: "no such file",
  // "cannot open: ...", "is not a regular file", "cannot map into memory: ...". `what` names the
  // file in the caller's words ("safetensors file 'w.safetensors'"). An empty file maps to no
  // bytes.
  static MappedFile open(const std::filesystem::path& path, const std::string& what);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  MappedFile(const std::byte* data, std::size_t size) : data_(data), size_(size) {}
  void unmap() noexcept;

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace loom::io
