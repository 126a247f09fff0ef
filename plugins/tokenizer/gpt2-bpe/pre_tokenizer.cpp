#include "pre_tokenizer.hpp"

#include <loom/error.hpp>
#include <string>

namespace loom::gpt2_bpe {

namespace {

// Unicode's White_Space property, which is what \s means in Python's `regex` module (and in
// tiktoken's Rust regex). PCRE2 10.42's \s under UCP also matches U+180E MONGOLIAN VOWEL SEPARATOR,
// which left White_Space in Unicode 6.3, so the set is spelled out.
std::string gpt2_pattern() {
  const std::string ws =
      "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
  return "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^" + ws + "\\p{L}\\p{N}]+|[" + ws + "]+(?![^" + ws + "])|[" +
         ws + "]+";
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

PreTokenizer::PreTokenizer() {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string pattern = gpt2_pattern();
  code_ =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF, &error, &offset, nullptr);
  if (!code_)
    throw InternalError("gpt2-bpe: PCRE2 refused GPT-2's pre-tokenizer pattern at offset " + std::to_string(offset) +
                        ": " + pcre2_message(error));
  // Without JIT (a PCRE2 built without it) the interpreter gives the same matches, slower.
  jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() {
  pcre2_code_free(code_);
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& pre_tokenizer)
    : data_(pcre2_match_data_create_from_pattern(pre_tokenizer.code_, nullptr)) {
  if (!data_) throw InternalError("gpt2-bpe: out of memory creating PCRE2 match data");
}

PreTokenizer::Scratch::~Scratch() {
  pcre2_match_data_free(data_);
}

std::size_t PreTokenizer::piece_end(std::string_view valid, std::size_t at, Scratch& scratch) const {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(valid.data());
  // The text was validated by the caller; PCRE2's own check would rescan the whole subject on
  // every call.
  const int rc = jit_ ? pcre2_jit_match(code_, subject, valid.size(), at, PCRE2_NO_UTF_CHECK, scratch.data_, nullptr)
                      : pcre2_match(code_, subject, valid.size(), at, PCRE2_NO_UTF_CHECK, scratch.data_, nullptr);
  if (rc < 0)
    throw InternalError("gpt2-bpe: the pre-tokenizer found no piece at byte " + std::to_string(at) + ": " +
                        pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(scratch.data_);
  // Every character starts some alternative (the last three cover letters, numbers, whitespace
  // and everything else), so the match starts where asked.
  if (ovector[0] != at || ovector[1] <= at)
    throw InternalError("gpt2-bpe: the pre-tokenizer skipped text at byte " + std::to_string(at));
  return ovector[1];
}

}  // namespace loom::gpt2_bpe
