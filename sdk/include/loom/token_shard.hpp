// Token shards: pre-tokenized data on disk, as `loom tokenize` writes them and the `tokens`
// dataset reads them.
//
// A shard is one file: a 64-byte header, the token ids (uint16 or uint32, little-endian), then
// the document index (uint64 end offsets). docs/datasets.md gives the layout byte by byte:
//
//   offset size  field
//        0    8  magic "LOOMTOKS"
//        8    4  version (u32) = 1
//       12    4  token_bytes (u32): 2 (uint16 ids) or 4 (uint32 ids)
//       16    8  num_tokens (u64)
//       24    8  num_documents (u64)
//       32    4  vocab_size (u32): the tokenizer's; every id is below it
//       36    4  max_token_id (u32): the largest id in the shard (0 when it has no tokens)
//       40    4  end_of_text (i32): the tokenizer's end-of-text id, or -1 when it has none
//       44    4  checksum (u32): CRC-32 (zlib's crc32) of every byte after the header
//       48   16  reserved, zero
//       64       num_tokens * token_bytes bytes of token ids
//                zero padding to a multiple of 8 bytes
//                num_documents u64: the exclusive end offset of each document, strictly
//                increasing, the last equal to num_tokens
//
// The file is exactly that long: a shorter or longer file is truncated or corrupt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>

namespace loom {

inline constexpr char token_shard_magic[8] = {'L', 'O', 'O', 'M', 'T', 'O', 'K', 'S'};
inline constexpr std::uint32_t token_shard_version = 1;
inline constexpr std::size_t token_shard_header_bytes = 64;

// What a shard's header says.
struct TokenShardInfo {
  std::uint32_t version = token_shard_version;
  std::uint32_t token_bytes = 2;
  std::int64_t num_tokens = 0;
  std::int64_t num_documents = 0;
  std::int64_t vocab_size = 0;
  std::int64_t max_token_id = 0;
  std::optional<std::int32_t> end_of_text;
  std::uint32_t checksum = 0;
};

// 2 when every id of a vocabulary of `vocab_size` fits in a uint16, else 4.
std::uint32_t token_bytes_for_vocab(std::int64_t vocab_size);

// CRC-32 as zlib's crc32() and Python's zlib.crc32() compute it; pass the previous result as
// `crc` to continue a running checksum.
std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0);

// A shard opened read-only and memory-mapped. Opening checks the header against the file's size;
// with `verify` it also reads every byte once to check the checksum, that every id is at most
// max_token_id and below vocab_size, and that the document index is increasing. Any failure is a
// UserError naming the file and what is wrong (bad magic, unsupported version, truncated, ...).
// Reading a shard's tokens from several threads at once is safe.
class TokenShard {
 public:
  static TokenShard open(const std::filesystem::path& file, bool verify = true);

  TokenShard(TokenShard&&) noexcept;
  TokenShard& operator=(TokenShard&&) noexcept;
  ~TokenShard();

  const std::filesystem::path& path() const;
  const TokenShardInfo& info() const;
  // num_tokens * token_bytes bytes of ids.
  const void* tokens() const;
  // The document end offsets, ascending; the last is num_tokens.
  std::span<const std::int64_t> document_ends() const;
  // Id number `i` (< num_tokens).
  std::int32_t token(std::int64_t i) const;

 private:
  struct Mapping;
  explicit TokenShard(std::unique_ptr<Mapping> mapping);
  std::unique_ptr<Mapping> mapping_;
};

// Writes one shard, streaming: ids are appended as they come and the header is written by
// finish(). The file appears under its name only once finish() succeeds (it is written to
// `<file>.partial` and renamed); a writer destroyed unfinished removes its partial file.
class TokenShardWriter {
 public:
  // `token_bytes` 0 picks token_bytes_for_vocab(vocab_size).
  TokenShardWriter(std::filesystem::path file, std::int64_t vocab_size, std::optional<std::int32_t> end_of_text,
                   std::uint32_t token_bytes = 0);
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;
  ~TokenShardWriter();

  // Appends ids to the current document. An id outside [0, vocab_size) is a UserError.
  void append(std::span<const std::int32_t> ids);
  // Ends the current document here (nothing happens when it is empty).
  void end_document();
  std::int64_t num_tokens() const;
  // Ends the last document, writes the document index and the header, and renames the file
  // into place. Returns the header it wrote.
  TokenShardInfo finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace loom
