// The byte tokenizer, loaded through the real plugin host.
#include <gtest/gtest.h>

#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <random>
#include <string>
#include <vector>

namespace {

class ByteTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    loom::PluginHost().load({{LOOM_TOKENIZER_PLUGIN, "test"}}, registry_);
    tokenizer_ = registry_.create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "byte", loom::Value(), "tokenizer"});
  }
  loom::Registry registry_;
  loom::Handle<loom::Tokenizer> tokenizer_;
};

TEST_F(ByteTokenizerTest, HasOneSymbolPerByteAndNoEndOfText) {
  EXPECT_EQ(tokenizer_->vocab_size(), 256);
  EXPECT_FALSE(tokenizer_->end_of_text().has_value());
  EXPECT_FALSE(tokenizer_->needs_fit());
  EXPECT_EQ(tokenizer_->state(), "");
}

TEST_F(ByteTokenizerTest, EncodesEachByteAsItsValue) {
  const std::string text = "Hi \xc3\xa9\n";  // "Hi é\n": the two bytes of é are two tokens
  EXPECT_EQ(tokenizer_->encode(text), (std::vector<std::int32_t>{72, 105, 32, 0xc3, 0xa9, 10}));
  EXPECT_TRUE(tokenizer_->encode("").empty());
}

TEST_F(ByteTokenizerTest, RoundTripsRandomBytesIncludingInvalidUtf8) {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 50; ++trial) {
    std::string text(static_cast<std::size_t>(trial * 37), '\0');
    for (char& c : text) c = static_cast<char>(byte(rng));
    const auto ids = tokenizer_->encode(text);
    ASSERT_EQ(ids.size(), text.size());
    for (auto id : ids) ASSERT_TRUE(id >= 0 && id < 256);
    ASSERT_EQ(tokenizer_->decode(ids), text);
  }
  const std::string every_byte = [] {
    std::string s;
    for (int b = 0; b < 256; ++b) s.push_back(static_cast<char>(b));
    return s;
  }();
  EXPECT_EQ(tokenizer_->decode(tokenizer_->encode(every_byte)), every_byte);
}

TEST_F(ByteTokenizerTest, DecodingAnIdOutsideTheVocabularyIsAUserError) {
  const std::vector<std::int32_t> ids{65, 256};
  try {
    tokenizer_->decode(ids);
    FAIL() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos) << e.what();
  }
  const std::vector<std::int32_t> negative{-1};
  EXPECT_THROW(tokenizer_->decode(negative), loom::UserError);
}

}  // namespace
