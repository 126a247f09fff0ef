// The pre-tokenizer: cuts text into the pieces BPE runs on, by one or more regular expressions
// applied in turn (Hugging Face's Sequence of Split pre-tokenizers; GPT-2's ByteLevel regex is one
// such Split). The default is GPT-2's, the regular expression of OpenAI's encoder.py,
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched as Python's `regex` module (and Hugging Face's Oniguruma) matches it: \p{L} and \p{N}
// are the Unicode letter and number categories, \s is the Unicode White_Space property (spelled
// out in the compiled pattern, because PCRE2's own \s is a slightly different set), and (?!\S)
// keeps the last whitespace character of a run for the word that follows it. Matching is done by
// PCRE2 in UTF mode with Unicode properties (UCP), JIT-compiled.
//
// A Split stage finds every match left to right (non-overlapping, as Oniguruma's find_iter); the
// matches and the stretches between them are the candidate pieces. `isolated` keeps both, each a
// piece of its own; `removed` drops the matches. `invert` swaps the two roles. Each piece of one
// stage is cut again by the next.
//
// Text that is not valid UTF-8 cannot be matched by a Unicode pattern; each maximal run of such
// bytes becomes one piece of its own (byte-level BPE encodes any bytes), and the valid text on
// either side is matched as if the run were the end or the start of the text.
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "loom/utf8.hpp"

namespace loom::gpt2_bpe {

// One Split stage (Hugging Face's Split pre-tokenizer).
struct SplitRule {
  enum class Behavior { isolated, removed };
  std::string pattern;   // Oniguruma syntax as tokenizer.json writes it (\s, \p{L}, (?i:...))
  bool literal = false;  // the pattern is a plain string ({"String": ...}), not a regex
  Behavior behavior = Behavior::isolated;
  bool invert = false;
};

// GPT-2's pattern as a SplitRule (isolated).
SplitRule gpt2_split_rule();

// `pattern` (Oniguruma syntax) as PCRE2 compiles it to the same matches: \s and \S become the
// White_Space set. Throws UserError for what cannot be carried over (\h, \H, \S inside a class).
std::string pcre2_pattern(std::string_view pattern);

class PreTokenizer {
 public:
  // GPT-2's pre-tokenizer.
  PreTokenizer();
  // The stages, applied in order. Throws UserError if PCRE2 refuses a pattern.
  explicit PreTokenizer(const std::vector<SplitRule>& rules);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // Match state for one thread; an encode call makes its own, so a const PreTokenizer can be
  // shared by concurrent callers.
  class Scratch {
   public:
    explicit Scratch(const PreTokenizer& pre_tokenizer);
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;

   private:
    friend class PreTokenizer;
    std::vector<pcre2_match_data*> data_;  // one per stage
  };

  // Calls emit(piece) for each non-empty piece of `text`, in order. Unless a stage removes text,
  // the pieces concatenate to `text`.
  template <class Emit>
  void split(std::string_view text, Scratch& scratch, Emit&& emit) const {
    split_stage(0, text, scratch, emit);
  }

  // The end of the first stage's match that starts at `at` in `valid` (valid UTF-8,
  // at < valid.size()), or `at` when no match starts there.
  std::size_t piece_end(std::string_view valid, std::size_t at, Scratch& scratch) const;

 private:
  struct Stage {
    pcre2_code* code = nullptr;
    bool jit = false;
    SplitRule::Behavior behavior = SplitRule::Behavior::isolated;
    bool invert = false;
  };

  // The next match at or after `from` in `valid`: [begin, end), or begin == npos when none.
  std::pair<std::size_t, std::size_t> find(const Stage& stage, std::string_view valid, std::size_t from,
                                           pcre2_match_data* data) const;
  void compile(const SplitRule& rule);

  template <class Emit>
  void split_stage(std::size_t stage, std::string_view text, Scratch& scratch, Emit& emit) const {
    if (text.empty()) return;
    if (stage == stages_.size()) {
      emit(text);
      return;
    }
    const Stage& s = stages_[stage];
    const bool last = stage + 1 == stages_.size();
    const auto piece = [&](std::string_view p, bool matched) {
      if (p.empty() || (s.behavior == SplitRule::Behavior::removed && matched != s.invert)) return;
      if (last)
        emit(p);  // the common case (GPT-2: one stage) without a call per piece
      else
        split_stage(stage + 1, p, scratch, emit);
    };
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t valid_end = valid_utf8_end(text, pos);
      const std::string_view valid = text.substr(pos, valid_end - pos);
      std::size_t gap = 0;  // start of the text not yet given out
      for (std::size_t from = 0; from < valid.size();) {
        const auto [begin, end] = find(s, valid, from, scratch.data_[stage]);
        if (begin == std::string_view::npos) break;
        piece(valid.substr(gap, begin - gap), false);
        if (end > begin) {
          piece(valid.substr(begin, end - begin), true);
          gap = from = end;
        } else {  // an empty match cuts the text there and the search moves on one character
          gap = begin;
          from = begin + std::max<std::size_t>(decode_utf8(valid, begin).length, 1);
        }
      }
      piece(valid.substr(gap), false);
      pos = valid_end;
      if (pos < text.size()) {
        const std::size_t invalid_end = invalid_utf8_end(text, pos);
        emit(text.substr(pos, invalid_end - pos));
        pos = invalid_end;
      }
    }
  }

  std::vector<Stage> stages_;
};

}  // namespace loom::gpt2_bpe
