#include "io/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "loom/error.hpp"

namespace loom::io {

std::string errno_text() {
  return errno_text(errno);
}

std::string errno_text(int error) {
  return std::strerror(error);
}

MappedFile MappedFile::open(const std::filesystem::path& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw UserError(what + ": no such file");
    throw UserError(what + ": cannot open: " + errno_text());
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // the mapping keeps the file
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UserError(what + ": cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) throw UserError(what + ": is not a regular file");
  const auto size = static_cast<std::size_t>(st.st_size);
  if (size == 0) return {};  // mmap refuses a length of 0
  void* base = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (base == MAP_FAILED) throw UserError(what + ": cannot map into memory: " + errno_text());
  return MappedFile(static_cast<const std::byte*>(base), size);
}

MappedFile::~MappedFile() {
  unmap();
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void MappedFile::unmap() noexcept {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace loom::io
