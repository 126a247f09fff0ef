// The `gpt2-bpe` tokenizer: GPT-2's byte-level BPE (Radford et al., 2019), as OpenAI's
// encoder.py defines it, and the byte-level BPE of Hugging Face tokenizer.json files that change
// the regular expression and add NFC (Llama 3, Qwen 2). Text is cut at special tokens
// (<|endoftext|>), each stretch is normalized (NFC, when the file asks) and cut into pieces by
// the pre-tokenizer's regular expressions (pre_tokenizer.hpp), and each piece's bytes are merged
// by BPE (bpe_merge.hpp), lowest merge rank first, every occurrence of the chosen pair left to
// right, until no adjacent pair has a rank.
#include <algorithm>
#include <array>
#include <cstring>
#include <loom/hf_interop.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <loom/plugin.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bpe_merge.hpp"
#include "bpe_model.hpp"
#include "loom/utf8.hpp"
#include "normalizer.hpp"
#include "pre_tokenizer.hpp"
#include "word_cache.hpp"

namespace loom::gpt2_bpe {
namespace {

// Unicode's White_Space property: what an added token's lstrip/rstrip takes.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Added tokens matched literally in text, before pre-tokenization: at each position the longest
// one that starts there, the leftmost match first (Hugging Face's leftmost-longest matching).
class AddedMatcher {
 public:
  explicit AddedMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
    // Longest first, so that of two tokens starting at one place the longer wins.
    std::stable_sort(tokens_.begin(), tokens_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (const auto& t : tokens_) starts_[static_cast<unsigned char>(t.content[0])] = true;
    for (int b = 0; b < 256; ++b)
      if (starts_[static_cast<std::size_t>(b)]) first_bytes_.push_back(static_cast<char>(b));
  }

  // Calls on_text(stretch) for the text between matches (possibly empty) and on_token(id) for
  // each match, in order.
  template <class OnText, class OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    std::size_t start = 0;  // of the text not yet given out
    for (std::size_t pos = 0;;) {
      pos = next_start(text, pos);
      if (pos == std::string_view::npos) break;
      const AddedToken* token = token_at(text, pos);
      if (!token) {
        ++pos;
        continue;
      }
      std::size_t begin = pos, end = pos + token->content.size();
      if (token->lstrip) begin = strip_left(text, start, begin);
      if (token->rstrip) end = strip_right(text, end);
      on_text(text.substr(start, begin - start));
      on_token(token->id);
      start = pos = end;
    }
    on_text(text.substr(start));
  }

 private:
  // The next position at or after `pos` where a token could start, or npos.
  std::size_t next_start(std::string_view text, std::size_t pos) const {
    if (first_bytes_.empty() || pos >= text.size()) return std::string_view::npos;
    if (first_bytes_.size() == 1) {  // GPT-2: only '<'
      const void* hit = std::memchr(text.data() + pos, first_bytes_[0], text.size() - pos);
      return hit ? static_cast<std::size_t>(static_cast<const char*>(hit) - text.data()) : std::string_view::npos;
    }
    for (; pos < text.size(); ++pos)
      if (starts_[static_cast<unsigned char>(text[pos])]) return pos;
    return std::string_view::npos;
  }

  const AddedToken* token_at(std::string_view text, std::size_t pos) const {
    const std::string_view rest = text.substr(pos);
    for (const auto& t : tokens_)
      if (rest.starts_with(t.content)) return &t;
    return nullptr;
  }

  // The start of the run of whitespace that ends at `end`, not before `floor`.
  static std::size_t strip_left(std::string_view text, std::size_t floor, std::size_t end) {
    while (end > floor) {
      std::size_t start = end - 1;
      while (start > floor && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
      const Utf8Char c = decode_utf8(text, start);
      if (c.length != end - start || !is_white_space(c.code_point)) break;
      end = start;
    }
    return end;
  }

  static std::size_t strip_right(std::string_view text, std::size_t start) {
    while (start < text.size()) {
      const Utf8Char c = decode_utf8(text, start);
      if (c.length == 0 || !is_white_space(c.code_point)) break;
      start += c.length;
    }
    return start;
  }

  std::vector<AddedToken> tokens_;
  std::array<bool, 256> starts_{};
  std::string first_bytes_;
};

// The added tokens encode() matches: all of them, or only those that are not special; `normalized`
// picks those matched in normalized (true) or raw (false) text.
std::vector<AddedToken> matched_tokens(const BpeModel& model, bool recognize_special_tokens, bool normalized) {
  std::vector<AddedToken> out;
  for (const auto& t : model.added_tokens()) {
    if ((!recognize_special_tokens && t.special) || t.normalized != normalized) continue;
    out.push_back(t);
    if (normalized) out.back().content = nfc(t.content);  // Hugging Face normalizes these tokens too
  }
  return out;
}

// Where the vocabulary came from: OpenAI's two files or a Hugging Face tokenizer.json.
struct Source {
  std::string encoder_json, vocab_bpe, tokenizer_json, end_of_text;
};

class Gpt2Bpe final : public Tokenizer, public HfTokenizer {
 public:
  Gpt2Bpe(BpeModel model, Source source, bool recognize_special_tokens, std::size_t cache_size)
      : model_(std::move(model)),
        source_(std::move(source)),
        pre_tokenizer_(model_.split_rules()),
        cache_(cache_size),
        raw_added_(matched_tokens(model_, recognize_special_tokens, false)),
        normalized_added_(matched_tokens(model_, recognize_special_tokens, true)) {}

  std::int64_t vocab_size() const override { return model_.vocab_size(); }

  std::optional<std::int32_t> end_of_text() const override {
    if (model_.end_of_text() < 0) return std::nullopt;
    return model_.end_of_text();
  }

  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    ids.reserve(text.size() / 3);  // English runs at about four bytes per token
    PreTokenizer::Scratch scratch(pre_tokenizer_);
    Buffers buffers;
    const auto encode_ordinary = [&](std::string_view stretch) {
      pre_tokenizer_.split(stretch, scratch, [&](std::string_view piece) { encode_piece(piece, ids, buffers); });
    };
    const auto add_token = [&](std::int32_t id) { ids.push_back(id); };
    // As Hugging Face's AddedVocabulary: tokens matched in the raw text first, then each stretch
    // between them normalized, then the tokens matched in normalized text, then pre-tokenization.
    raw_added_.split(
        text,
        [&](std::string_view stretch) {
          if (!model_.nfc()) return encode_ordinary(stretch);
          const std::string normal = nfc(stretch);
          normalized_added_.split(normal, encode_ordinary, add_token);
        },
        add_token);
    return ids;
  }

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size() * 4);
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const std::string* token = model_.token(ids[i]);
      if (!token)
        throw UserError("gpt2-bpe: token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                        (ids[i] >= 0 && ids[i] < model_.vocab_size()
                             ? " is not in the vocabulary (no token has this id)"
                             : " is outside the vocabulary [0, " + std::to_string(model_.vocab_size()) + ")"));
      text += *token;
    }
    return text;
  }

  // transformers' GPT2Tokenizer reads OpenAI's two files as vocab.json and merges.txt (or, for a
  // tokenizer.json, GPT2TokenizerFast that file); tokenizer_config.json names the class and the
  // special tokens.
  std::vector<HfFile> hf_tokenizer_files(std::int64_t model_max_length) const override {
    std::vector<HfFile> files;
    if (source_.tokenizer_json.empty()) {
      files.push_back(
          {"vocab.json", read_file(source_.encoder_json, "encoder_json file '" + source_.encoder_json + "'")});
      files.push_back({"merges.txt", read_file(source_.vocab_bpe, "vocab_bpe file '" + source_.vocab_bpe + "'")});
    } else {
      files.push_back({"tokenizer.json",
                       read_file(source_.tokenizer_json, "tokenizer_json file '" + source_.tokenizer_json + "'")});
    }
    nlohmann::ordered_json config = {{"tokenizer_class", "GPT2Tokenizer"},
                                     {"model_max_length", model_max_length},
                                     {"add_prefix_space", false},
                                     {"errors", "replace"},
                                     {"clean_up_tokenization_spaces", false}};
    nlohmann::ordered_json specials = nlohmann::ordered_json::object();
    if (!source_.end_of_text.empty())
      for (const char* role : {"bos_token", "eos_token", "unk_token"}) {
        config[role] = source_.end_of_text;
        specials[role] = source_.end_of_text;
      }
    files.push_back({"tokenizer_config.json", config.dump(2) + "\n"});
    files.push_back({"special_tokens_map.json", specials.dump(2) + "\n"});
    return files;
  }

 private:
  // Reused from piece to piece within one encode call.
  struct Buffers {
    std::vector<std::int32_t> symbols;
    MergeScratch merge;
  };

  void encode_piece(std::string_view piece, std::vector<std::int32_t>& ids, Buffers& buffers) const {
    if (piece.size() == 1) {
      ids.push_back(model_.byte_id(static_cast<unsigned char>(piece[0])));
      return;
    }
    const std::uint64_t hash = WordCache::hash(piece);
    if (cache_.lookup(piece, hash, ids)) return;
    if (model_.ignore_merges()) {
      if (const std::int32_t whole = model_.find(piece); whole >= 0) {
        ids.push_back(whole);
        return;
      }
    }
    std::vector<std::int32_t>& symbols = buffers.symbols;
    symbols.resize(piece.size());
    for (std::size_t i = 0; i < piece.size(); ++i) symbols[i] = model_.byte_id(static_cast<unsigned char>(piece[i]));
    bpe_merge(model_.merges(), symbols, buffers.merge);
    ids.insert(ids.end(), symbols.begin(), symbols.end());
    cache_.insert(piece, hash, symbols);
  }

  BpeModel model_;
  Source source_;
  PreTokenizer pre_tokenizer_;
  mutable WordCache cache_;  // encode is const, and safe to call concurrently: the cache locks
  AddedMatcher raw_added_, normalized_added_;
};

OptionSchema options() {
  OptionSchema s;
  s.string("encoder_json", std::nullopt,
           "OpenAI's encoder.json (token -> id), given with `vocab_bpe`; or give `tokenizer_json` instead. A path "
           "relative to the current directory; null (or \"\"): not given.");
  s.string("vocab_bpe", std::nullopt,
           "OpenAI's vocab.bpe (the merges, in rank order), given with `encoder_json`. A path relative to the current "
           "directory.");
  s.string("tokenizer_json", std::nullopt,
           "A Hugging Face tokenizer.json with a byte-level BPE model, instead of `encoder_json` + `vocab_bpe`. A "
           "path relative to the current directory.");
  s.string("end_of_text", "<|endoftext|>",
           "The token that separates documents (end_of_text()); \"\" or null when the vocabulary has none.")
      .nullable();
  s.boolean("recognize_special_tokens", true,
            "Encode special tokens written in the text (<|endoftext|>, a tokenizer.json's added tokens) as their "
            "ids; when false those marked special are encoded as ordinary text (the other added tokens still "
            "match).");
  s.integer("cache_size", 100000, "How many distinct pieces (words) to remember the encoding of; 0 turns it off.")
      .range(0, 10000000);
  return s;
}

std::string optional_string(const Options& o, const char* name) {
  return o.get_optional<std::string>(name).value_or("");
}

std::unique_ptr<Tokenizer> create(const Options& o) {
  const std::string encoder_json = optional_string(o, "encoder_json");
  const std::string vocab_bpe = optional_string(o, "vocab_bpe");
  const std::string tokenizer_json = optional_string(o, "tokenizer_json");
  const std::string end_of_text = optional_string(o, "end_of_text");
  const bool openai = !encoder_json.empty() || !vocab_bpe.empty();
  if (openai && !tokenizer_json.empty())
    throw UserError(
        "gpt2-bpe: give either `encoder_json` and `vocab_bpe` (OpenAI's files) or `tokenizer_json` "
        "(a Hugging Face file), not both");
  if (!openai && tokenizer_json.empty())
    throw UserError(
        "gpt2-bpe: no vocabulary given; set `encoder_json` and `vocab_bpe` to OpenAI's GPT-2 files, or "
        "`tokenizer_json` to a Hugging Face tokenizer.json");
  if (openai && (encoder_json.empty() || vocab_bpe.empty()))
    throw UserError(std::string("gpt2-bpe: `") + (encoder_json.empty() ? "vocab_bpe" : "encoder_json") +
                    "` is set but `" + (encoder_json.empty() ? "encoder_json" : "vocab_bpe") +
                    "` is not; OpenAI's format needs both files");
  BpeModel model = openai ? BpeModel::from_openai_files(encoder_json, vocab_bpe, end_of_text)
                          : BpeModel::from_tokenizer_json(tokenizer_json, end_of_text);
  return std::make_unique<Gpt2Bpe>(std::move(model), Source{encoder_json, vocab_bpe, tokenizer_json, end_of_text},
                                   o.get<bool>("recognize_special_tokens"),
                                   static_cast<std::size_t>(o.get<std::int64_t>("cache_size")));
}

void register_components(Registrar& registrar) {
  registrar.add<Tokenizer>(
      {.name = "gpt2-bpe",
       .description = "Byte-level BPE: GPT-2 (encoder.json + vocab.bpe), or a tokenizer.json (GPT-2, Llama 3, Qwen 2)",
       .version = "1.0.0",
       .options = options()},
      [](const Options& o, const CreateContext&) { return create(o); });
}

}  // namespace
}  // namespace loom::gpt2_bpe

LOOM_PLUGIN(loom::gpt2_bpe::register_components)
