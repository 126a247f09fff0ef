// GPT-2's pre-tokenizer: the regular expression of OpenAI's encoder.py that cuts text into the
// pieces BPE runs on,
//
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//
// matched as Python's `regex` module matches it: \p{L} and \p{N} are the Unicode letter and
// number categories, \s is the Unicode White_Space property (spelled out in the pattern, because
// PCRE2's own \s is a slightly different set), and (?!\S) keeps the last whitespace character of a run
// for the word that follows it. Matching is done by PCRE2, JIT-compiled.
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
#include <string_view>

#include "loom/utf8.hpp"

namespace loom::gpt2_bpe {

class PreTokenizer {
 public:
  // Compiles the pattern; throws InternalError if PCRE2 refuses it.
  PreTokenizer();
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
    pcre2_match_data* data_;
  };

  // Calls emit(piece) for each piece of `text`, in order; the pieces concatenate to `text`.
  template <class Emit>
  void split(std::string_view text, Scratch& scratch, Emit&& emit) const {
    std::size_t pos = 0;
    while (pos < text.size()) {
      const std::size_t valid_end = valid_utf8_end(text, pos);
      const std::string_view valid = text.substr(pos, valid_end - pos);
      for (std::size_t at = 0; at < valid.size();) {
        const std::size_t end = piece_end(valid, at, scratch);
        emit(valid.substr(at, end - at));
        at = end;
      }
      pos = valid_end;
      if (pos < text.size()) {
        const std::size_t invalid_end = invalid_utf8_end(text, pos);
        emit(text.substr(pos, invalid_end - pos));
        pos = invalid_end;
      }
    }
  }

  // The end of the piece that starts at `at` in `valid` (valid UTF-8, at < valid.size()).
  std::size_t piece_end(std::string_view valid, std::size_t at, Scratch& scratch) const;

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

}  // namespace loom::gpt2_bpe
