// The ids of pieces already encoded. Text repeats its words, and BPE on a word costs far more
// than a hash lookup, so gpt2-bpe remembers each piece it encodes (OpenAI's encoder.py keeps the
// same cache). It is looked up once per piece, so it is built for that: open addressing with
// 8-byte slots over a flat arena (a lookup touches one slot and one arena line, where a
// node-based map chases three pointers), grown as it fills so that a corpus's working set stays
// in cache, and sharded so that concurrent encode calls rarely meet, each shard behind a
// reader-writer lock. A full shard is emptied and refilled, so memory stays bounded on any corpus.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string_view>
#include <vector>

namespace loom::gpt2_bpe {

class WordCache {
 public:
  // Pieces (and encodings) longer than this are not cached: they rarely repeat.
  static constexpr std::size_t kMaxPiece = 255;

  // `capacity` pieces in all; 0 turns the cache off.
  explicit WordCache(std::size_t capacity) : shard_capacity_((capacity + kShards - 1) / kShards) {}

  static std::uint64_t hash(std::string_view piece) {
    // 8 bytes per multiply: pieces are short words, and a collision costs a compare, not a wrong id.
    std::uint64_t h = 0x243F6A8885A308D3ULL ^ piece.size();
    std::size_t i = 0;
    for (; i + 8 <= piece.size(); i += 8) {
      std::uint64_t chunk;
      std::memcpy(&chunk, piece.data() + i, 8);
      h = mix(h ^ chunk);
    }
    if (i < piece.size()) {
      std::uint64_t chunk = 0;
      std::memcpy(&chunk, piece.data() + i, piece.size() - i);
      h = mix(h ^ chunk);
    }
    return h;
  }

  // Appends the cached ids of `piece` (whose hash() is `h`) to `out` and returns true, or returns
  // false.
  bool lookup(std::string_view piece, std::uint64_t h, std::vector<std::int32_t>& out) const {
    if (shard_capacity_ == 0) return false;
    const Shard& shard = shards_[h >> kShardShift];
    std::shared_lock lock(shard.mutex);
    const std::uint32_t tag = tag_of(h);
    const std::size_t mask = shard.slots.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot slot = shard.slots[i];
      if (slot.tag == 0) return false;
      if (slot.tag != tag) continue;
      const char* entry = shard.arena.data() + slot.offset;
      const Header header = read_header(entry);
      if (header.piece_size != piece.size() || std::memcmp(entry + sizeof(Header), piece.data(), piece.size()) != 0)
        continue;
      const std::size_t begin = out.size();
      out.resize(begin + header.id_count);
      std::memcpy(out.data() + begin, entry + sizeof(Header) + piece.size(), header.id_count * sizeof(std::int32_t));
      return true;
    }
  }

  void insert(std::string_view piece, std::uint64_t h, std::span<const std::int32_t> ids) {
    if (shard_capacity_ == 0 || piece.size() > kMaxPiece || ids.size() > kMaxPiece) return;
    Shard& shard = shards_[h >> kShardShift];
    std::unique_lock lock(shard.mutex);
    if (shard.size >= shard_capacity_) {
      std::fill(shard.slots.begin(), shard.slots.end(), Slot{});
      shard.arena.clear();
      shard.size = 0;
    }
    if (2 * (shard.size + 1) > shard.slots.size()) grow(shard);  // at most half full: short probe chains
    const std::uint32_t tag = tag_of(h);
    const std::size_t mask = shard.slots.size() - 1;
    std::size_t i = h & mask;
    for (; shard.slots[i].tag != 0; i = (i + 1) & mask) {
      const Slot slot = shard.slots[i];
      const char* entry = shard.arena.data() + slot.offset;
      if (slot.tag == tag && read_header(entry).piece_size == piece.size() &&
          std::memcmp(entry + sizeof(Header), piece.data(), piece.size()) == 0)
        return;  // another thread put it there first
    }
    shard.slots[i] = {tag, static_cast<std::uint32_t>(shard.arena.size())};
    const Header header{static_cast<std::uint16_t>(piece.size()), static_cast<std::uint16_t>(ids.size())};
    const auto* header_bytes = reinterpret_cast<const char*>(&header);
    shard.arena.insert(shard.arena.end(), header_bytes, header_bytes + sizeof header);
    shard.arena.insert(shard.arena.end(), piece.begin(), piece.end());
    const auto* id_bytes = reinterpret_cast<const char*>(ids.data());
    shard.arena.insert(shard.arena.end(), id_bytes, id_bytes + ids.size_bytes());
    ++shard.size;
  }

 private:
  static constexpr std::size_t kShards = 16;
  static constexpr int kShardShift = 60;  // the top four bits pick the shard, the low bits the slot
  static std::uint64_t mix(std::uint64_t h) {
    h *= 0x9E3779B97F4A7C15ULL;
    return h ^ (h >> 29);
  }
  // Bits 28..59 of the hash, never 0 (0 marks an empty slot): independent of the slot index.
  static std::uint32_t tag_of(std::uint64_t h) { return static_cast<std::uint32_t>(h >> 28) | 1u; }

  struct Slot {
    std::uint32_t tag = 0;
    std::uint32_t offset = 0;  // of the entry in the arena
  };
  // An arena entry is a Header, the piece's bytes, then its ids.
  struct Header {
    std::uint16_t piece_size;
    std::uint16_t id_count;
  };
  static Header read_header(const char* entry) {
    Header h;
    std::memcpy(&h, entry, sizeof h);
    return h;
  }
  struct Shard {
    mutable std::shared_mutex mutex;
    std::vector<Slot> slots = std::vector<Slot>(64);
    std::vector<char> arena;
    std::size_t size = 0;
  };

  // Doubles the slots of `shard`; its entries stay where they are in the arena.
  static void grow(Shard& shard) {
    std::vector<Slot> slots(shard.slots.size() * 2);
    const std::size_t mask = slots.size() - 1;
    for (const Slot& s : shard.slots) {
      if (s.tag == 0) continue;
      const Header header = read_header(shard.arena.data() + s.offset);
      const std::uint64_t h = hash({shard.arena.data() + s.offset + sizeof(Header), header.piece_size});
      std::size_t i = h & mask;
      while (slots[i].tag != 0) i = (i + 1) & mask;
      slots[i] = s;
    }
    shard.slots = std::move(slots);
  }

  std::size_t shard_capacity_;
  std::array<Shard, kShards> shards_;
};

}  // namespace loom::gpt2_bpe
