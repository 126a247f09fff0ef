// The char tokenizer, loaded through the real plugin host.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace {

using Ids = std::vector<std::int32_t>;

class CharTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override { loom::PluginHost().load({{LOOM_TOKENIZER_PLUGIN, "test"}}, registry_); }

  loom::Handle<loom::Tokenizer> make(const std::string& unknown = "") {
    loom::Value node = loom::Value::map();
    node.set("type", "char");
    if (!unknown.empty()) node.set("unknown", unknown);
    return registry_.create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "char", node, "tokenizer"});
  }

  loom::Registry registry_;
};

// Runs `body`, expects a UserError, and returns its message.
template <class F>
std::string user_error(F&& body) {
  try {
    body();
  } catch (const loom::UserError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a loom::UserError";
  return "";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST_F(CharTokenizerTest, UsingItBeforeFitIsAUserError) {
  auto t = make();
  EXPECT_TRUE(t->needs_fit());
  EXPECT_EQ(t->state(), "");
  EXPECT_TRUE(contains(user_error([&] { t->vocab_size(); }), "fit"));
  EXPECT_TRUE(contains(user_error([&] { t->encode("abc"); }), "before the vocabulary exists"));
  const Ids ids{0};
  EXPECT_TRUE(contains(user_error([&] { t->decode(ids); }), "fit"));
}

TEST_F(CharTokenizerTest, VocabularyIsTheSortedDistinctCharacters) {
  auto t = make();
  t->fit("hello world");
  EXPECT_FALSE(t->needs_fit());
  // ' ' d e h l o r w
  EXPECT_EQ(t->vocab_size(), 8);
  EXPECT_EQ(t->encode("hello world"), (Ids{3, 2, 4, 4, 5, 0, 7, 5, 6, 4, 1}));
  EXPECT_EQ(t->decode(Ids{1, 5, 7}), "dow");
  EXPECT_FALSE(t->end_of_text().has_value());
}

TEST_F(CharTokenizerTest, MultiByteCharactersAreOneSymbolOrderedByCodePoint) {
  auto t = make();
  // U+00E9 é, U+00EF ï, U+65E5 日, U+672C 本, U+1F600 😀 (four bytes), and ASCII.
  const std::string text = "na\xc3\xafve caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80!";
  t->fit(text);
  // ' ' ! a c e f n v é ï 日 本 😀
  EXPECT_EQ(t->vocab_size(), 13);
  const Ids ids = t->encode(text);
  EXPECT_EQ(ids, (Ids{6, 2, 9, 7, 4, 0, 3, 2, 5, 8, 0, 10, 11, 0, 12, 1}));
  EXPECT_EQ(t->decode(ids), text);
  EXPECT_EQ(t->decode(Ids{12}), "\xf0\x9f\x98\x80");
}

TEST_F(CharTokenizerTest, UnknownCharacterIsAUserErrorNamingItAndItsPosition) {
  auto t = make();
  t->fit("abc\n");
  const std::string message = user_error([&] { t->encode("ab\nca\xc3\xa9z"); });
  EXPECT_TRUE(contains(message, "'\xc3\xa9' (U+00E9)")) << message;
  EXPECT_TRUE(contains(message, "byte offset 5 (line 2, column 3)")) << message;
  EXPECT_TRUE(contains(message, "unknown: skip")) << message;
  // Invisible characters are named by number only.
  const std::string tab = user_error([&] { t->encode("a\tb"); });
  EXPECT_TRUE(contains(tab, "character U+0009 at byte offset 1")) << tab;
}

TEST_F(CharTokenizerTest, SkipDropsUnknownCharacters) {
  auto t = make("skip");
  t->fit("abc");
  EXPECT_EQ(t->encode("a\xc3\xa9xbc!"), (Ids{0, 1, 2}));
}

TEST_F(CharTokenizerTest, InvalidUtf8IsAUserErrorWithItsOffset) {
  auto t = make("skip");
  const std::string bad_fit = user_error([&] { t->fit(std::string("ok\n\xff", 4)); });
  EXPECT_TRUE(contains(bad_fit, "not valid UTF-8 at byte offset 3 (line 2, column 1)")) << bad_fit;
  EXPECT_TRUE(contains(bad_fit, "0xFF")) << bad_fit;
  // Overlong encodings and lone surrogates are refused as Python's decoder refuses them.
  EXPECT_THROW(t->fit("\xc0\xaf"), loom::UserError);
  EXPECT_THROW(t->fit("\xed\xa0\x80"), loom::UserError);
  EXPECT_THROW(t->fit("\xe6\x97"), loom::UserError);  // truncated
  EXPECT_TRUE(contains(user_error([&] { t->fit(""); }), "empty"));
  t->fit("abc");
  EXPECT_THROW(t->encode("a\x80"), loom::UserError);  // even with skip: the text is not UTF-8
}

TEST_F(CharTokenizerTest, DecodingAnIdOutsideTheVocabularyIsAUserError) {
  auto t = make();
  t->fit("ab");
  const std::string message = user_error([&] { t->decode(Ids{0, 2}); });
  EXPECT_TRUE(contains(message, "token id 2 at position 1 is outside the vocabulary [0, 2)")) << message;
  EXPECT_THROW(t->decode(Ids{-1}), loom::UserError);
}

TEST_F(CharTokenizerTest, StateRoundTripsExactly) {
  auto fitted = make();
  const std::string text = "To be, or not to be: \xe2\x80\x94 \xf0\x9f\x98\x80\n\ttab";
  fitted->fit(text);
  const std::string state = fitted->state();
  ASSERT_FALSE(state.empty());

  auto restored = make();
  ASSERT_TRUE(restored->needs_fit());
  restored->load_state(state);
  EXPECT_FALSE(restored->needs_fit());
  EXPECT_EQ(restored->vocab_size(), fitted->vocab_size());
  EXPECT_EQ(restored->encode(text), fitted->encode(text));
  EXPECT_EQ(restored->decode(fitted->encode(text)), text);
  EXPECT_EQ(restored->state(), state);

  // Restoring what an unfitted tokenizer saved gives an unfitted tokenizer.
  restored->load_state("");
  EXPECT_TRUE(restored->needs_fit());
  EXPECT_THROW(restored->vocab_size(), loom::UserError);
}

TEST_F(CharTokenizerTest, CorruptStateIsAUserError) {
  auto t = make();
  EXPECT_TRUE(contains(user_error([&] { t->load_state("{not json"); }), "not JSON"));
  EXPECT_TRUE(contains(user_error([&] { t->load_state(R"({"tokenizer":"byte","version":1})"); }), "not a char"));
  EXPECT_TRUE(contains(user_error([&] { t->load_state(R"({"tokenizer":"char","version":7,"code_points":[65]})"); }),
                       "version 7"));
  EXPECT_TRUE(contains(user_error([&] { t->load_state(R"({"tokenizer":"char","version":1,"code_points":[66,65]})"); }),
                       "sorted"));
  EXPECT_TRUE(contains(user_error([&] { t->load_state(R"({"tokenizer":"char","version":1,"code_points":[55296]})"); }),
                       "scalar"));
  EXPECT_TRUE(t->needs_fit());
}

TEST_F(CharTokenizerTest, TinyShakespeareGivesNanoGptsVocabulary) {
  const std::filesystem::path file = LOOM_TINYSHAKESPEARE;  // configs/data/tinyshakespeare.txt
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  std::ifstream in(file, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  auto t = make();
  t->fit(buffer.str());
  // nanoGPT's data/shakespeare_char/prepare.py prints these 65 characters.
  EXPECT_EQ(t->vocab_size(), 65);
  EXPECT_EQ(t->decode(t->encode(buffer.str())), buffer.str());
  std::vector<std::int32_t> all(65);
  for (int i = 0; i < 65; ++i) all[static_cast<std::size_t>(i)] = i;
  EXPECT_EQ(t->decode(all), "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz");
  // As in Karpathy's "Let's build GPT" walkthrough of the same vocabulary.
  EXPECT_EQ(t->encode("hii there"), (Ids{46, 47, 47, 1, 58, 46, 43, 56, 43}));
}

}  // namespace
