// A byte-level BPE vocabulary as gpt2-bpe uses it: every token as the raw bytes it stands for,
// the merges as (left id, right id) -> (rank, merged id), and the added (special) tokens matched
// literally in text. Loaded from OpenAI's encoder.json + vocab.bpe or from a Hugging Face
// tokenizer.json; every problem with a file is a UserError naming the file and the entry.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pre_tokenizer.hpp"

namespace loom::gpt2_bpe {

// A token matched literally in text before pre-tokenization (<|endoftext|>).
struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool lstrip = false;  // the match takes the whitespace on its left (Hugging Face's AddedToken flag)
  bool rstrip = false;  // ... and on its right
  bool special = true;  // a special token (recognize_special_tokens: false encodes it as text)
  // Matched in the normalized text rather than the raw one (only with a normalizer; Hugging
  // Face's default for added tokens that are not special).
  bool normalized = false;
};

// (left, right) -> (rank, merged) in an open-addressing table: the BPE loop looks a pair up for
// every adjacent pair of every word it has not seen, so this is the hot lookup.
class MergeTable {
 public:
  struct Merge {
    std::int32_t left, right, merged;
  };
  static constexpr std::uint64_t kNone = ~0ULL;

  // Merges in rank order. A pair listed twice keeps its later rank, as dict(zip(merges, ranks))
  // in OpenAI's encoder.py does.
  void build(const std::vector<Merge>& merges);
  // (rank << 32) | merged, or kNone when the pair never merges.
  std::uint64_t find(std::int32_t left, std::int32_t right) const {
    const std::uint64_t key = pack(left, right);
    for (std::size_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.key == key) return s.value;
      if (s.key == kEmptyKey) return kNone;
    }
  }
  std::size_t size() const { return size_; }

 private:
  static constexpr std::uint64_t kEmptyKey = ~0ULL;  // ids are non-negative, so no pair packs to it
  struct Slot {
    std::uint64_t key = kEmptyKey;
    std::uint64_t value = kNone;
  };
  static std::uint64_t pack(std::int32_t left, std::int32_t right) {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
  }
  std::size_t slot_of(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ULL) >> shift_);
  }
  std::vector<Slot> slots_ = std::vector<Slot>(2);
  std::size_t mask_ = 1;
  int shift_ = 63;
  std::size_t size_ = 0;
};

class BpeModel {
 public:
  // OpenAI's GPT-2 files: encoder.json (byte-symbol string -> id) and vocab.bpe (a "#version"
  // line, then one merge "left right" per line, in rank order). `end_of_text` (raw text, may
  // be "") is the vocabulary entry treated as a special token in text.
  static BpeModel from_openai_files(const std::string& encoder_json, const std::string& vocab_bpe,
                                    const std::string& end_of_text);
  // A Hugging Face tokenizer.json with a byte-level BPE model (model.vocab, model.merges as
  // "left right" strings or [left, right] pairs, added_tokens), its normalizer (none or NFC) and
  // its pre-tokenizer (GPT-2's ByteLevel, or a Sequence of Splits ending in a ByteLevel that does
  // not split, as Llama 3 and Qwen 2 write).
  static BpeModel from_tokenizer_json(const std::string& tokenizer_json, const std::string& end_of_text);

  // One above the largest id.
  std::int64_t vocab_size() const { return static_cast<std::int64_t>(tokens_.size()); }
  // The raw bytes of token `id`, or nullptr for an id outside the vocabulary (or a gap in it).
  const std::string* token(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= tokens_.size() || !present_[static_cast<std::size_t>(id)])
      return nullptr;
    return &tokens_[static_cast<std::size_t>(id)];
  }
  // The id of the vocabulary entry or added token whose bytes are `text`; -1 when none.
  std::int32_t find(std::string_view text) const {
    const auto it = ids_.find(text);
    return it == ids_.end() ? -1 : it->second;
  }
  std::int32_t byte_id(unsigned char b) const { return byte_ids_[b]; }
  const MergeTable& merges() const { return merges_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  // Hugging Face's `ignore_merges`: a piece that is a whole vocabulary entry is that entry.
  bool ignore_merges() const { return ignore_merges_; }
  // The end-of-text id, or -1 when `end_of_text` was "".
  std::int32_t end_of_text() const { return end_of_text_; }
  // The pre-tokenizer's stages (GPT-2's alone unless a tokenizer.json says otherwise).
  const std::vector<SplitRule>& split_rules() const { return split_rules_; }
  // Whether text is put in NFC before pre-tokenization (Qwen 2).
  bool nfc() const { return nfc_; }

 private:
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
  };
  friend class VocabularyBuilder;

  std::vector<std::string> tokens_;
  std::vector<char> present_;
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> ids_;
  std::array<std::int32_t, 256> byte_ids_{};
  MergeTable merges_;
  std::vector<AddedToken> added_;
  bool ignore_merges_ = false;
  std::int32_t end_of_text_ = -1;
  std::vector<SplitRule> split_rules_{gpt2_split_rule()};
  bool nfc_ = false;
};

// The bytes of the file at `path` (relative to the current directory); `what` names it in errors
// ("encoder_json file 'x.json'").
std::string read_file(const std::string& path, const std::string& what);

}  // namespace loom::gpt2_bpe
