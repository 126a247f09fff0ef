// gpt2-bpe reading Hugging Face tokenizer.json files with the pipelines of Llama 3 (Split regex
// with \p{N}{1,3}, ignore_merges) and Qwen 2 (NFC, Split regex with \p{N}), and a Sequence of
// Splits (String pattern, Removed, invert): loaded through the real plugin host, every text of
// hf_reference.py must give the ids Hugging Face's `tokenizers` gives, token for token.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "../normalizer.hpp"
#include "../pre_tokenizer.hpp"
#include "reference_required.hpp"

namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;
using nlohmann::json;

const fs::path kReference = LOOM_HF_REFERENCE_DIR;

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class HfBpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new loom::Registry;
    loom::PluginHost().load({{LOOM_TOKENIZER_PLUGIN, "test"}}, *registry_);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }

  static loom::Handle<loom::Tokenizer> make(const fs::path& tokenizer_json, const std::string& end_of_text = "") {
    loom::Value node = loom::Value::map();
    node.set("type", "gpt2-bpe");
    node.set("tokenizer_json", tokenizer_json.string());
    node.set("end_of_text", end_of_text);
    return registry_->create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "gpt2-bpe", node, "tokenizer"});
  }

  static std::string user_error(const fs::path& tokenizer_json) {
    try {
      make(tokenizer_json);
    } catch (const loom::UserError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a loom::UserError for " << tokenizer_json;
    return "";
  }

  // Every text of NAME.expected.json encoded by loom against `tokenizers`' ids.
  static void check(const std::string& name) {
    const fs::path file = kReference / (name + ".tokenizer.json");
    if (!fs::exists(file))
      return loom::test::skip_missing_reference("no " + file.string() +
                                                ": ctest's tokenizer_hf_bpe_reference writes it (and skips when "
                                                "the Python package `tokenizers` is missing)");
    const auto tokenizer = make(file);
    const json expected = json::parse(read_file(kReference / (name + ".expected.json")));
    std::size_t texts = 0, agreeing = 0, tokens = 0;
    for (const auto& e : expected) {
      const std::string text = e["text"].get<std::string>();
      const Ids want = e["ids"].get<Ids>();
      const Ids got = tokenizer->encode(text);
      ++texts;
      tokens += want.size();
      if (got == want) {
        ++agreeing;
      } else {
        std::size_t first = 0;
        while (first < got.size() && first < want.size() && got[first] == want[first]) ++first;
        ADD_FAILURE() << name << ": text " << e["name"] << " (" << json(text.substr(0, 200)).dump()
                      << ") differs from tokenizers at token " << first << " of " << want.size() << ": loom "
                      << (first < got.size() ? std::to_string(got[first]) : "(end)") << ", tokenizers "
                      << (first < want.size() ? std::to_string(want[first]) : "(end)");
      }
    }
    std::cout << "[ agreement ] " << name << ": " << agreeing << " of " << texts << " texts (" << tokens
              << " tokens) identical to tokenizers\n";
    EXPECT_GT(texts, 300u);
  }

  static inline loom::Registry* registry_ = nullptr;
};

TEST_F(HfBpeTest, Llama3PipelineMatchesTokenizers) {
  check("llama3");
}

TEST_F(HfBpeTest, Qwen2PipelineWithNfcMatchesTokenizers) {
  check("qwen2");
}

TEST_F(HfBpeTest, SplitsRemovedInvertedAndLiteralMatchTokenizers) {
  check("splits");
}

TEST_F(HfBpeTest, Llama3DecodesBackToTheText) {
  const fs::path file = kReference / "llama3.tokenizer.json";
  if (!fs::exists(file)) return loom::test::skip_missing_reference("no " + file.string());
  const auto tokenizer = make(file, "<|end_of_text|>");
  EXPECT_EQ(tokenizer->end_of_text(), std::optional<std::int32_t>(1));
  for (const std::string text : {"It's 12345 ünïcödé 😀 東京\n\n  x", "<|eot_id|>a<|begin_of_text|>"})
    EXPECT_EQ(tokenizer->decode(tokenizer->encode(text)), text);
}

// The special tokens (special: true) are encoded as text with recognize_special_tokens false; the
// other added tokens still match.
TEST_F(HfBpeTest, RecognizeSpecialTokensFalseKeepsOrdinaryAddedTokens) {
  const fs::path file = kReference / "llama3.tokenizer.json";
  if (!fs::exists(file)) return loom::test::skip_missing_reference("no " + file.string());
  loom::Value node = loom::Value::map();
  node.set("type", "gpt2-bpe");
  node.set("tokenizer_json", file.string());
  node.set("end_of_text", "");
  node.set("recognize_special_tokens", false);
  const auto plain = registry_->create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "gpt2-bpe", node, "tokenizer"});
  const Ids ids = plain->encode("<|eot_id|>assistant");
  EXPECT_GT(ids.size(), 2u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 0);  // <|eot_id|>
  EXPECT_EQ(make(file)->encode("<|eot_id|>")[0], 2);
  EXPECT_EQ(plain->decode(ids), "<|eot_id|>assistant");
}

// Pipelines gpt2-bpe does not implement are refused, each with a message naming what is wrong.
TEST_F(HfBpeTest, RefusesPipelinesItDoesNotImplement) {
  const fs::path file = kReference / "qwen2.tokenizer.json";
  if (!fs::exists(file)) return loom::test::skip_missing_reference("no " + file.string());
  const json base = json::parse(read_file(file));
  const fs::path dir = fs::temp_directory_path() / ("loom-hf-bpe-" + std::to_string(std::random_device()()));
  fs::create_directories(dir);
  const auto variant = [&](const std::string& what, const std::function<void(json&)>& change) {
    json j = base;
    change(j);
    const fs::path p = dir / (what + ".json");
    std::ofstream(p) << j.dump();
    return user_error(p);
  };
  EXPECT_NE(variant("nfkc",
                    [](json& j) {
                      j["normalizer"] = {{"type", "NFKC"}};
                    })
                .find("its normalizer is"),
            std::string::npos);
  EXPECT_NE(variant("prefix", [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; })
                .find("add_prefix_space"),
            std::string::npos);
  EXPECT_NE(variant("digits",
                    [](json& j) {
                      j["pre_tokenizer"]["pretokenizers"].insert(j["pre_tokenizer"]["pretokenizers"].begin(),
                                                                 json{{"type", "Digits"}, {"individual_digits", true}});
                    })
                .find("its pre_tokenizer is"),
            std::string::npos);
  EXPECT_NE(
      variant("merged", [](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithPrevious"; })
          .find("\"MergedWithPrevious\""),
      std::string::npos);
  EXPECT_NE(variant("null", [](json& j) { j["pre_tokenizer"] = nullptr; }).find("its pre_tokenizer is null"),
            std::string::npos);
  EXPECT_NE(variant("fallback", [](json& j) { j["model"]["byte_fallback"] = true; }).find("byte_fallback"),
            std::string::npos);
  EXPECT_NE(variant("hex",
                    [](json& j) {
                      j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "\\h+"}};
                    })
                .find("hexadecimal"),
            std::string::npos);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

TEST(HfPattern, WhiteSpaceClassesAreSpelledOut) {
  using loom::gpt2_bpe::pcre2_pattern;
  const std::string ws = pcre2_pattern("[\\s]").substr(1);  // the set, then "]"
  EXPECT_EQ(pcre2_pattern("\\s+(?!\\S)"), "[" + ws + "+(?![^" + ws + ")");
  EXPECT_EQ(pcre2_pattern("[^\\s\\p{L}]"), "[^" + ws.substr(0, ws.size() - 1) + "\\p{L}]");
  EXPECT_EQ(pcre2_pattern("[]\\s]"), "[]" + ws);
  EXPECT_EQ(pcre2_pattern("a\\\\s"), "a\\\\s");  // an escaped backslash, then the letter s
  EXPECT_THROW(pcre2_pattern("[^\\S]"), loom::UserError);
}

TEST(HfNormalizer, NfcComposesAndKeepsInvalidBytes) {
  using loom::gpt2_bpe::nfc;
  EXPECT_EQ(nfc("cafe\xcc\x81"), "caf\xc3\xa9");  // e + U+0301 -> é
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("A\xcc\x8a\xff"
                "e\xcc\x81"),
            "\xc3\x85\xff\xc3\xa9");                           // Å, a stray byte, é
  EXPECT_EQ(nfc("\xe1\x84\x80\xe1\x85\xa1"), "\xea\xb0\x80");  // Hangul jamo -> 가
}

}  // namespace
