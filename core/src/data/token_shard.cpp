#include "loom/token_shard.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "io/mapped_file.hpp"
#include "loom/error.hpp"

namespace fs = std::filesystem;

namespace loom {

static_assert(std::endian::native == std::endian::little,
              "token shards are little-endian and read in place: a big-endian host needs byte swapping");

namespace {

// Slicing-by-8 tables for the reflected CRC-32 polynomial (zlib's).
constexpr std::array<std::array<std::uint32_t, 256>, 8> make_crc_tables() {
  std::array<std::array<std::uint32_t, 256>, 8> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[0][i] = c;
  }
  for (std::uint32_t i = 0; i < 256; ++i)
    for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xffu];
  return t;
}
constexpr auto crc_tables = make_crc_tables();

using io::errno_text;

// The header as stored: little-endian fields at fixed offsets.
struct RawHeader {
  char magic[8];
  std::uint32_t version;
  std::uint32_t token_bytes;
  std::uint64_t num_tokens;
  std::uint64_t num_documents;
  std::uint32_t vocab_size;
  std::uint32_t max_token_id;
  std::int32_t end_of_text;
  std::uint32_t checksum;
  std::uint8_t reserved[16];
};
static_assert(sizeof(RawHeader) == token_shard_header_bytes);
static_assert(offsetof(RawHeader, num_tokens) == 16 && offsetof(RawHeader, vocab_size) == 32 &&
              offsetof(RawHeader, checksum) == 44 && offsetof(RawHeader, reserved) == 48);

constexpr std::uint64_t pad8(std::uint64_t n) {
  return (n + 7) & ~std::uint64_t{7};
}

template <class T>
std::int64_t max_id(const T* p, std::int64_t n) {
  T m = 0;
  for (std::int64_t i = 0; i < n; ++i) m = std::max(m, p[i]);
  return static_cast<std::int64_t>(m);
}

}  // namespace

std::uint32_t token_bytes_for_vocab(std::int64_t vocab_size) {
  return vocab_size <= 65536 ? 2u : 4u;
}

std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc) {
  crc = ~crc;
  const std::byte* p = bytes.data();
  std::size_t n = bytes.size();
  while (n >= 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    word ^= crc;
    crc = crc_tables[7][word & 0xff] ^ crc_tables[6][(word >> 8) & 0xff] ^ crc_tables[5][(word >> 16) & 0xff] ^
          crc_tables[4][(word >> 24) & 0xff] ^ crc_tables[3][(word >> 32) & 0xff] ^ crc_tables[2][(word >> 40) & 0xff] ^
          crc_tables[1][(word >> 48) & 0xff] ^ crc_tables[0][word >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = crc_tables[0][(crc ^ static_cast<std::uint32_t>(*p++)) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

// ---- reading ----

struct TokenShard::Mapping {
  fs::path path;
  TokenShardInfo info;
  io::MappedFile file;
  const std::byte* base = nullptr;  // file.data()
  const std::int64_t* document_ends = nullptr;
};

TokenShard::TokenShard(std::unique_ptr<Mapping> mapping) : mapping_(std::move(mapping)) {}
TokenShard::TokenShard(TokenShard&&) noexcept = default;
TokenShard& TokenShard::operator=(TokenShard&&) noexcept = default;
TokenShard::~TokenShard() = default;

const fs::path& TokenShard::path() const {
  return mapping_->path;
}
const TokenShardInfo& TokenShard::info() const {
  return mapping_->info;
}
const void* TokenShard::tokens() const {
  return mapping_->base + token_shard_header_bytes;
}
std::span<const std::int64_t> TokenShard::document_ends() const {
  return {mapping_->document_ends, static_cast<std::size_t>(mapping_->info.num_documents)};
}
std::int32_t TokenShard::token(std::int64_t i) const {
  const std::byte* p = mapping_->base + token_shard_header_bytes;
  if (mapping_->info.token_bytes == 2) return reinterpret_cast<const std::uint16_t*>(p)[i];
  return static_cast<std::int32_t>(reinterpret_cast<const std::uint32_t*>(p)[i]);
}

TokenShard TokenShard::open(const fs::path& file, bool verify) {
  const std::string name = file.string();
  auto fail = [&](const std::string& what) -> UserError { return UserError("token shard " + name + ": " + what); };

  io::MappedFile mapped = io::MappedFile::open(file, "token shard " + name);
  const std::uint64_t size = mapped.size();
  if (size < sizeof(token_shard_magic))
    throw fail("not a loom token shard: " + std::to_string(size) + " bytes, shorter than the 8-byte magic");

  auto m = std::make_unique<Mapping>();
  m->path = file;
  m->file = std::move(mapped);
  m->base = m->file.data();

  if (std::memcmp(m->base, token_shard_magic, sizeof(token_shard_magic)) != 0)
    throw fail("not a loom token shard (bad magic: the file does not start with \"LOOMTOKS\")");
  if (size < token_shard_header_bytes)
    throw fail("truncated: " + std::to_string(size) + " bytes, shorter than the 64-byte header");
  RawHeader h;
  std::memcpy(&h, m->base, sizeof h);
  if (h.version != token_shard_version)
    throw fail("unsupported shard version " + std::to_string(h.version) + " (this loom reads version " +
               std::to_string(token_shard_version) + "; rewrite the shard with this loom's `loom tokenize`)");
  if (h.token_bytes != 2 && h.token_bytes != 4)
    throw fail("corrupt header: token_bytes is " + std::to_string(h.token_bytes) + ", expected 2 or 4");
  // Bounds that keep the size arithmetic below from overflowing.
  constexpr std::uint64_t limit = std::uint64_t{1} << 58;
  if (h.num_tokens >= limit || h.num_documents >= limit)
    throw fail("corrupt header: " + std::to_string(h.num_tokens) + " tokens in " + std::to_string(h.num_documents) +
               " documents");
  const std::uint64_t index_offset = token_shard_header_bytes + pad8(h.num_tokens * h.token_bytes);
  const std::uint64_t expected = index_offset + 8 * h.num_documents;
  if (size < expected)
    throw fail("truncated: " + std::to_string(size) + " bytes, but its header describes " +
               std::to_string(h.num_tokens) + " tokens of " + std::to_string(h.token_bytes) + " bytes and " +
               std::to_string(h.num_documents) + " documents, " + std::to_string(expected) + " bytes in all");
  if (size > expected)
    throw fail("corrupt: " + std::to_string(size) + " bytes, but its header describes " + std::to_string(expected) +
               " bytes (" + std::to_string(h.num_tokens) + " tokens, " + std::to_string(h.num_documents) +
               " documents)");
  if (h.vocab_size == 0 || (h.token_bytes == 2 && h.vocab_size > 65536))
    throw fail("corrupt header: vocab_size " + std::to_string(h.vocab_size) + " with " + std::to_string(h.token_bytes) +
               "-byte tokens");
  if (h.max_token_id >= h.vocab_size)
    throw fail("corrupt header: max_token_id " + std::to_string(h.max_token_id) + " is not below vocab_size " +
               std::to_string(h.vocab_size));
  if (h.end_of_text < -1 || (h.end_of_text >= 0 && static_cast<std::uint32_t>(h.end_of_text) >= h.vocab_size))
    throw fail("corrupt header: end_of_text " + std::to_string(h.end_of_text) + " outside the vocabulary");
  if ((h.num_tokens == 0) != (h.num_documents == 0))
    throw fail("corrupt header: " + std::to_string(h.num_tokens) + " tokens in " + std::to_string(h.num_documents) +
               " documents");

  m->document_ends = reinterpret_cast<const std::int64_t*>(m->base + index_offset);
  TokenShardInfo& info = m->info;
  info.version = h.version;
  info.token_bytes = h.token_bytes;
  info.num_tokens = static_cast<std::int64_t>(h.num_tokens);
  info.num_documents = static_cast<std::int64_t>(h.num_documents);
  info.vocab_size = h.vocab_size;
  info.max_token_id = h.max_token_id;
  if (h.end_of_text >= 0) info.end_of_text = h.end_of_text;
  info.checksum = h.checksum;

  if (info.num_documents > 0 && m->document_ends[info.num_documents - 1] != info.num_tokens)
    throw fail("corrupt document index: the last document ends at " +
               std::to_string(m->document_ends[info.num_documents - 1]) + ", not at the shard's " +
               std::to_string(info.num_tokens) + " tokens");

  if (verify) {
    const std::uint32_t crc =
        crc32({m->base + token_shard_header_bytes, static_cast<std::size_t>(size - token_shard_header_bytes)});
    if (crc != h.checksum)
      throw fail("checksum mismatch (the header says " + std::to_string(h.checksum) + ", the data gives " +
                 std::to_string(crc) + "): the file is corrupt");
    const void* tokens = m->base + token_shard_header_bytes;
    const std::int64_t seen = h.token_bytes == 2 ? max_id(static_cast<const std::uint16_t*>(tokens), info.num_tokens)
                                                 : max_id(static_cast<const std::uint32_t*>(tokens), info.num_tokens);
    if (seen != info.max_token_id)
      throw fail("corrupt: the largest token id is " + std::to_string(seen) + ", the header says " +
                 std::to_string(info.max_token_id));
    std::int64_t previous = 0;
    for (std::int64_t d = 0; d < info.num_documents; ++d) {
      if (m->document_ends[d] <= previous)
        throw fail("corrupt document index: document " + std::to_string(d) + " ends at " +
                   std::to_string(m->document_ends[d]) + ", not after " + std::to_string(previous));
      previous = m->document_ends[d];
    }
  }
  return TokenShard(std::move(m));
}

// ---- writing ----

struct TokenShardWriter::State {
  fs::path file, partial;
  std::ofstream out;
  TokenShardInfo info;
  std::uint32_t crc = 0;
  std::vector<std::int64_t> document_ends;
  std::vector<std::byte> buffer;
  bool finished = false;

  void write(const void* data, std::size_t n) {
    const auto* bytes = static_cast<const std::byte*>(data);
    crc = crc32({bytes, n}, crc);
    out.write(reinterpret_cast<const char*>(bytes), static_cast<std::streamsize>(n));
    if (!out) throw UserError("cannot write " + partial.string() + ": " + errno_text());
  }
};

TokenShardWriter::TokenShardWriter(fs::path file, std::int64_t vocab_size, std::optional<std::int32_t> end_of_text,
                                   std::uint32_t token_bytes)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  if (vocab_size <= 0 || vocab_size > std::numeric_limits<std::uint32_t>::max())
    throw UserError("cannot write token shard " + file.string() + ": vocabulary size " + std::to_string(vocab_size) +
                    " is not in [1, 2^32)");
  if (token_bytes == 0) token_bytes = token_bytes_for_vocab(vocab_size);
  if (token_bytes != 2 && token_bytes != 4)
    throw UserError("cannot write token shard " + file.string() + ": token bytes must be 2 or 4, not " +
                    std::to_string(token_bytes));
  if (token_bytes == 2 && vocab_size > 65536)
    throw UserError("cannot write token shard " + file.string() + ": a vocabulary of " + std::to_string(vocab_size) +
                    " ids does not fit in 2-byte tokens; use 4");
  if (end_of_text && (*end_of_text < 0 || *end_of_text >= vocab_size))
    throw UserError("cannot write token shard " + file.string() + ": end-of-text id " + std::to_string(*end_of_text) +
                    " is outside the vocabulary of " + std::to_string(vocab_size));
  s.file = std::move(file);
  s.partial = s.file;
  s.partial += ".partial";
  s.info.token_bytes = token_bytes;
  s.info.vocab_size = vocab_size;
  s.info.end_of_text = end_of_text;
  if (s.file.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(s.file.parent_path(), ec);
    if (ec) throw UserError("cannot create directory " + s.file.parent_path().string() + ": " + ec.message());
  }
  s.out.open(s.partial, std::ios::binary | std::ios::trunc);
  if (!s.out) throw UserError("cannot create " + s.partial.string() + ": " + errno_text());
  const std::array<char, token_shard_header_bytes> zeroed_header{};
  s.out.write(zeroed_header.data(), zeroed_header.size());  // the header, written last
}

TokenShardWriter::~TokenShardWriter() {
  if (state_ && !state_->finished) {
    state_->out.close();
    std::error_code ec;
    fs::remove(state_->partial, ec);
  }
}

void TokenShardWriter::append(std::span<const std::int32_t> ids) {
  State& s = *state_;
  if (s.finished) throw InternalError("TokenShardWriter::append after finish");
  const std::size_t bytes = ids.size() * s.info.token_bytes;
  s.buffer.resize(bytes);
  std::int32_t largest = static_cast<std::int32_t>(s.info.max_token_id);
  bool bad = false;
  for (const std::int32_t id : ids) {
    bad |= id < 0 || id >= s.info.vocab_size;
    largest = std::max(largest, id);
  }
  if (bad) {
    for (std::size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0 || ids[i] >= s.info.vocab_size)
        throw UserError("cannot write token shard " + s.file.string() + ": token id " + std::to_string(ids[i]) +
                        " (token " + std::to_string(s.info.num_tokens + static_cast<std::int64_t>(i)) +
                        ") is outside the tokenizer's vocabulary of " + std::to_string(s.info.vocab_size));
  }
  if (s.info.token_bytes == 2) {
    auto* out = reinterpret_cast<std::uint16_t*>(s.buffer.data());
    for (std::size_t i = 0; i < ids.size(); ++i) out[i] = static_cast<std::uint16_t>(ids[i]);
  } else {
    std::memcpy(s.buffer.data(), ids.data(), bytes);
  }
  s.write(s.buffer.data(), bytes);
  s.info.num_tokens += static_cast<std::int64_t>(ids.size());
  s.info.max_token_id = largest;
}

void TokenShardWriter::end_document() {
  State& s = *state_;
  const std::int64_t last = s.document_ends.empty() ? 0 : s.document_ends.back();
  if (s.info.num_tokens > last) s.document_ends.push_back(s.info.num_tokens);
}

std::int64_t TokenShardWriter::num_tokens() const {
  return state_->info.num_tokens;
}

TokenShardInfo TokenShardWriter::finish() {
  State& s = *state_;
  if (s.finished) throw InternalError("TokenShardWriter::finish called twice");
  end_document();
  const std::uint64_t token_bytes = static_cast<std::uint64_t>(s.info.num_tokens) * s.info.token_bytes;
  const std::array<char, 8> zeros{};
  s.write(zeros.data(), pad8(token_bytes) - token_bytes);
  s.write(s.document_ends.data(), s.document_ends.size() * sizeof(std::int64_t));
  s.info.num_documents = static_cast<std::int64_t>(s.document_ends.size());
  s.info.checksum = s.crc;

  RawHeader h{};
  std::memcpy(h.magic, token_shard_magic, sizeof h.magic);
  h.version = token_shard_version;
  h.token_bytes = s.info.token_bytes;
  h.num_tokens = static_cast<std::uint64_t>(s.info.num_tokens);
  h.num_documents = static_cast<std::uint64_t>(s.info.num_documents);
  h.vocab_size = static_cast<std::uint32_t>(s.info.vocab_size);
  h.max_token_id = static_cast<std::uint32_t>(s.info.max_token_id);
  h.end_of_text = s.info.end_of_text.value_or(-1);
  h.checksum = s.info.checksum;
  s.out.seekp(0);
  s.out.write(reinterpret_cast<const char*>(&h), sizeof h);
  s.out.close();
  if (!s.out) throw UserError("cannot write " + s.partial.string() + ": " + errno_text());
  std::error_code ec;
  fs::rename(s.partial, s.file, ec);
  if (ec) throw UserError("cannot rename " + s.partial.string() + " to " + s.file.string() + ": " + ec.message());
  s.finished = true;
  return s.info;
}

}  // namespace loom
