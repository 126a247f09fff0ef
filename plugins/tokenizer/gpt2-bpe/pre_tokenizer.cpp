#include "pre_tokenizer.hpp"

#include <loom/error.hpp>
#include <string>

namespace loom::gpt2_bpe {

namespace {

// Unicode's White_Space property, which is what \s means in Python's `regex` module, in
// tiktoken's Rust regex and in Oniguruma (Hugging Face tokenizers). PCRE2 10.42's \s under UCP
// also matches U+180E MONGOLIAN VOWEL SEPARATOR, which left White_Space in Unicode 6.3, so the set
// is spelled out.
constexpr const char* kWhiteSpace =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

SplitRule gpt2_split_rule() {
  return {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", false,
          SplitRule::Behavior::isolated, false};
}

std::string pcre2_pattern(std::string_view pattern) {
  const std::string ws = kWhiteSpace;
  std::string out;
  int class_depth = 0;  // inside [...] (Oniguruma nests classes)
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char e = pattern[++i];
      if (e == 's') {
        out += class_depth > 0 ? ws : "[" + ws + "]";
      } else if (e == 'S') {
        if (class_depth > 0)
          throw UserError("the pre-tokenizer pattern " + std::string(pattern) +
                          " has \\S inside a character class, which gpt2-bpe cannot carry over to PCRE2");
        out += "[^" + ws + "]";
      } else if (e == 'h' || e == 'H') {
        throw UserError("the pre-tokenizer pattern " + std::string(pattern) + " uses \\" + std::string(1, e) +
                        ", which means a hexadecimal digit to Oniguruma and horizontal space to PCRE2; gpt2-bpe "
                        "refuses it rather than match differently");
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[') {
      ++class_depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (c == ']' && class_depth > 0) --class_depth;
    out += c;
  }
  return out;
}

PreTokenizer::PreTokenizer() {
  compile(gpt2_split_rule());
}

PreTokenizer::PreTokenizer(const std::vector<SplitRule>& rules) {
  try {
    for (const auto& rule : rules) compile(rule);
  } catch (...) {
    for (auto& s : stages_) pcre2_code_free(s.code);
    throw;
  }
}

void PreTokenizer::compile(const SplitRule& rule) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  const std::string pattern = rule.literal ? rule.pattern : pcre2_pattern(rule.pattern);
  // Oniguruma's Ruby syntax (Hugging Face's) reads ^ and $ at line boundaries: MULTILINE.
  const uint32_t options = rule.literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error, &offset, nullptr);
  if (!code)
    throw UserError("gpt2-bpe: PCRE2 refused the pre-tokenizer pattern " + rule.pattern + " (compiled as " + pattern +
                    ") at offset " + std::to_string(offset) + ": " + pcre2_message(error));
  Stage s;
  s.code = code;
  // Without JIT (a PCRE2 built without it) the interpreter gives the same matches, slower.
  s.jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  s.behavior = rule.behavior;
  s.invert = rule.invert;
  stages_.push_back(s);
}

PreTokenizer::~PreTokenizer() {
  for (auto& s : stages_) pcre2_code_free(s.code);
}

PreTokenizer::Scratch::Scratch(const PreTokenizer& pre_tokenizer) {
  for (const auto& s : pre_tokenizer.stages_) {
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(s.code, nullptr);
    if (!data) {
      for (auto* d : data_) pcre2_match_data_free(d);
      throw InternalError("gpt2-bpe: out of memory creating PCRE2 match data");
    }
    data_.push_back(data);
  }
}

PreTokenizer::Scratch::~Scratch() {
  for (auto* d : data_) pcre2_match_data_free(d);
}

std::pair<std::size_t, std::size_t> PreTokenizer::find(const Stage& stage, std::string_view valid, std::size_t from,
                                                       pcre2_match_data* data) const {
  const auto subject = reinterpret_cast<PCRE2_SPTR>(valid.data());
  // The text was validated by the caller; PCRE2's own check would rescan the whole subject on
  // every call.
  const int rc = stage.jit ? pcre2_jit_match(stage.code, subject, valid.size(), from, PCRE2_NO_UTF_CHECK, data, nullptr)
                           : pcre2_match(stage.code, subject, valid.size(), from, PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return {std::string_view::npos, std::string_view::npos};
  if (rc < 0)
    throw InternalError("gpt2-bpe: the pre-tokenizer failed at byte " + std::to_string(from) + ": " +
                        pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  return {ovector[0], ovector[1]};
}

std::size_t PreTokenizer::piece_end(std::string_view valid, std::size_t at, Scratch& scratch) const {
  const auto [begin, end] = find(stages_.front(), valid, at, scratch.data_.front());
  return begin == at ? end : at;
}

}  // namespace loom::gpt2_bpe
