// GPT-2's pre-tokenizer against Python's `regex` module running the same pattern
// (gpt2_reference.py writes what the module gives), and on text that is not UTF-8.
#include "../pre_tokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "loom/utf8.hpp"

namespace {

namespace fs = std::filesystem;
using loom::gpt2_bpe::PreTokenizer;

const fs::path kReference = LOOM_GPT2_REFERENCE_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> split(const PreTokenizer& pre, std::string_view text) {
  PreTokenizer::Scratch scratch(pre);
  std::vector<std::string> pieces;
  pre.split(text, scratch, [&](std::string_view piece) { pieces.emplace_back(piece); });
  return pieces;
}

// Why the reference file is unavailable, or "" when it is there.
std::string missing_reference(const char* file) {
  if (fs::exists(kReference / file)) return "";
  return "no reference " + (kReference / file).string() +
         ": ctest's tokenizer_gpt2_bpe_reference writes it (and skips when Python's `regex` module is missing)";
}

TEST(Gpt2PreTokenizer, CutsTextAsPythonRegexDoes) {
  if (auto why = missing_reference("cases.json"); !why.empty()) GTEST_SKIP() << why;
  const PreTokenizer pre;
  const auto cases = nlohmann::json::parse(read_file(kReference / "cases.json"));
  ASSERT_GT(cases.size(), 400u);
  for (const auto& c : cases) {
    const std::string text = c["text"];
    // The reference splits at <|endoftext|> before the pattern runs; so does the tokenizer.
    std::vector<std::string> pieces;
    for (std::size_t start = 0;;) {
      const std::size_t at = text.find("<|endoftext|>", start);
      for (auto& p : split(pre, std::string_view(text).substr(start, at == std::string::npos ? at : at - start)))
        pieces.push_back(std::move(p));
      if (at == std::string::npos) break;
      start = at + 13;
    }
    EXPECT_EQ(pieces, c["pieces"].get<std::vector<std::string>>()) << "case " << c["name"] << ": " << c["text"].dump();
  }
}

// Every code point's class (letter, number, whitespace, other) as the pattern sees it, against
// the `regex` module's \p{L}, \p{N} and \s: the probe "a"+c is one piece exactly when c is a
// letter, "1"+c when a number, "\t"+c when whitespace, "!"+c when none of them.
TEST(Gpt2PreTokenizer, ClassifiesEveryCodePointAsPythonRegexDoes) {
  if (auto why = missing_reference("classes.bin"); !why.empty()) GTEST_SKIP() << why;
  const std::string classes = read_file(kReference / "classes.bin");
  ASSERT_EQ(classes.size(), 0x110000u);
  const PreTokenizer pre;
  PreTokenizer::Scratch scratch(pre);
  const std::string probes = "a1\t!", names = "LNSO";
  std::size_t compared = 0, mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const char expected = classes[cp];
    if (expected == 'X') continue;
    std::string text = "?";
    loom::append_utf8(text, cp);
    std::string got;
    for (std::size_t k = 0; k < probes.size(); ++k) {
      text[0] = probes[k];
      if (pre.piece_end(text, 0, scratch) == text.size()) got += names[k];
    }
    ++compared;
    if (got != std::string(1, expected) && ++mismatches <= 20)
      ADD_FAILURE() << "U+" << std::hex << static_cast<unsigned>(cp) << ": regex says " << expected << ", loom says '"
                    << got << "'";
  }
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(compared, 1100000u);
}

TEST(Gpt2PreTokenizer, KeepsTheLastSpaceOfARunForTheNextWord) {
  const PreTokenizer pre;
  EXPECT_EQ(split(pre, "a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(split(pre, "a \n\nb"), (std::vector<std::string>{"a", " \n", "\n", "b"}));
  EXPECT_EQ(split(pre, "end  "), (std::vector<std::string>{"end", "  "}));
  EXPECT_EQ(split(pre, "it's we'll"), (std::vector<std::string>{"it", "'s", " we", "'ll"}));
  EXPECT_TRUE(split(pre, "").empty());
}

TEST(Gpt2PreTokenizer, InvalidUtf8RunsArePiecesOfTheirOwn) {
  const PreTokenizer pre;
  const std::string text = "ab\xff\xfe cd \xe6\x97 e\xed\xa0\x80";  // stray bytes, a truncated 日, a surrogate
  const auto pieces = split(pre, text);
  EXPECT_EQ(pieces, (std::vector<std::string>{"ab", "\xff\xfe", " cd", " ", "\xe6\x97", " e", "\xed\xa0\x80"}));
  std::string joined;
  for (const auto& p : pieces) joined += p;
  EXPECT_EQ(joined, text);
}

}  // namespace
