#include "checkpoint/durable_io.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {

namespace {

std::string errno_text() {
  return std::strerror(errno);
}

}  // namespace

void write_synced(const fs::path& path, std::string_view contents) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError("cannot create '" + path.string() + "': " + errno_text());
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string reason = errno_text();
      ::close(fd);
      throw UserError("cannot write '" + path.string() + "': " + reason);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    throw UserError("cannot flush '" + path.string() + "' to disk: " + reason);
  }
  if (::close(fd) != 0) throw UserError("cannot write '" + path.string() + "': " + errno_text());
}

void sync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot open '" + path.string() + "' to flush it: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string reason = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) throw UserError("cannot flush '" + path.string() + "' to disk: " + reason);
}

void replace_atomically(const fs::path& path, std::string_view contents) {
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const fs::path temp = dir / ("." + path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove(temp, ec);
  write_synced(temp, contents);
  if (::rename(temp.c_str(), path.c_str()) != 0) {
    const std::string reason = errno_text();
    fs::remove(temp, ec);
    throw UserError("cannot replace '" + path.string() + "': " + reason);
  }
  sync_path(dir);
}

std::string read_whole(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UserError("cannot read '" + path.string() + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace loom::checkpoint
