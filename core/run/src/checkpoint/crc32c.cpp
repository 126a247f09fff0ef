#include "checkpoint/crc32c.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "loom/error.hpp"

namespace loom::checkpoint {

namespace {

constexpr std::uint32_t kPolynomial = 0x82f63b78u;  // reflected Castagnoli

// table[k][b]: the CRC of byte b followed by k zero bytes ("slicing by 8").
struct Tables {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  Tables() {
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (std::uint32_t b = 0; b < 256; ++b)
      for (std::size_t k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xffu];
  }
};

std::uint32_t crc32c_table(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  static const Tables tables;
  const auto& t = tables.t;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = t[7][word & 0xff] ^ t[6][(word >> 8) & 0xff] ^ t[5][(word >> 16) & 0xff] ^ t[4][(word >> 24) & 0xff] ^
          t[3][(word >> 32) & 0xff] ^ t[2][(word >> 40) & 0xff] ^ t[1][(word >> 48) & 0xff] ^ t[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) std::uint32_t crc32c_sse42(std::uint32_t crc, const unsigned char* p, std::size_t n) {
  std::uint64_t c = crc;
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<std::uint32_t>(c);
  while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

bool has_sse42() {
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
}
#endif

}  // namespace

std::uint32_t crc32c(std::uint32_t crc, const void* data, std::size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__x86_64__)
  if (has_sse42()) return ~crc32c_sse42(crc, p, size);
#endif
  return ~crc32c_table(crc, p, size);
}

FileChecksum checksum_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw UserError("cannot read '" + path.string() + "': " + std::strerror(errno));
  FileChecksum sum;
  std::vector<unsigned char> buffer(std::size_t{1} << 20);
  while (true) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      const std::string reason = std::strerror(errno);
      ::close(fd);
      throw UserError("cannot read '" + path.string() + "': " + reason);
    }
    if (got == 0) break;
    sum.crc32c = crc32c(sum.crc32c, buffer.data(), static_cast<std::size_t>(got));
    sum.size += static_cast<std::uint64_t>(got);
  }
  ::close(fd);
  return sum;
}

}  // namespace loom::checkpoint
