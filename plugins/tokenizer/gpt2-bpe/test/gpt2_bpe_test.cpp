// The gpt2-bpe tokenizer, loaded through the real plugin host, against ids computed by
// gpt2_reference.py (OpenAI's published algorithm in Python, not loom).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <loom/kinds/tokenizer.hpp>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;
using nlohmann::json;

const fs::path kData = LOOM_DATA_DIR;
const fs::path kReference = LOOM_GPT2_REFERENCE_DIR;
const std::string kEncoderJson = (kData / "gpt2" / "encoder.json").string();
const std::string kVocabBpe = (kData / "gpt2" / "vocab.bpe").string();

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A fresh directory for files a test writes, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("loom-gpt2-bpe-" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

class Gpt2BpeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new loom::Registry;
    loom::PluginHost().load({{LOOM_TOKENIZER_PLUGIN, "test"}}, *registry_);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }

  void SetUp() override {
    // They ship with the repository (configs/data/gpt2): a missing file is a broken checkout.
    ASSERT_TRUE(fs::exists(kEncoderJson) && fs::exists(kVocabBpe)) << "no GPT-2 vocabulary under " << kData / "gpt2";
  }

  static loom::Handle<loom::Tokenizer> make(loom::Value node) {
    node.set("type", "gpt2-bpe");
    return registry_->create<loom::Tokenizer>(loom::ComponentRef{"tokenizer", "gpt2-bpe", node, "tokenizer"});
  }
  static loom::Value openai_files() {
    loom::Value node = loom::Value::map();
    node.set("encoder_json", kEncoderJson);
    node.set("vocab_bpe", kVocabBpe);
    return node;
  }
  static loom::Value tokenizer_json(const fs::path& p) {
    loom::Value node = loom::Value::map();
    node.set("tokenizer_json", p.string());
    return node;
  }
  // The tokenizer made from OpenAI's files, shared by the tests that only encode.
  static const loom::Tokenizer& gpt2() {
    static const loom::Handle<loom::Tokenizer> tokenizer = make(openai_files());
    return *tokenizer;
  }

  static std::string user_error(const loom::Value& node) {
    try {
      make(node);
    } catch (const loom::UserError& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected a loom::UserError for " << node.to_flow();
    return "";
  }

  static std::string missing_reference(const char* file) {
    if (fs::exists(kReference / file)) return "";
    return "no reference " + (kReference / file).string() +
           ": ctest's tokenizer_gpt2_bpe_reference writes it (and skips when Python's `regex` module is missing)";
  }

  static inline loom::Registry* registry_ = nullptr;
};

TEST_F(Gpt2BpeTest, HasGpt2sVocabularyAndEndOfText) {
  EXPECT_EQ(gpt2().vocab_size(), 50257);
  ASSERT_TRUE(gpt2().end_of_text().has_value());
  EXPECT_EQ(*gpt2().end_of_text(), 50256);
  EXPECT_FALSE(gpt2().needs_fit());
  EXPECT_EQ(gpt2().state(), "");
  EXPECT_EQ(gpt2().encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(gpt2().decode(Ids{50256}), "<|endoftext|>");
  // Well-known ids: "Hello world" is [15496, 995] in every GPT-2 tokenizer.
  EXPECT_EQ(gpt2().encode("Hello world"), (Ids{15496, 995}));
}

TEST_F(Gpt2BpeTest, EncodesVariedTextToTheReferenceIds) {
  if (auto why = missing_reference("cases.json"); !why.empty()) GTEST_SKIP() << why;
  const json cases = json::parse(read_file(kReference / "cases.json"));
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const Ids expected = c["ids"].get<Ids>();
    EXPECT_EQ(gpt2().encode(text), expected) << "case " << c["name"] << ": " << c["text"].dump();
    EXPECT_EQ(gpt2().decode(expected), text) << "case " << c["name"];
  }
}

TEST_F(Gpt2BpeTest, EncodesTinyShakespeareToTheReferenceIds) {
  if (auto why = missing_reference("tinyshakespeare.ids"); !why.empty()) GTEST_SKIP() << why;
  const std::string text = read_file(kData / "tinyshakespeare.txt");
  const std::string raw = read_file(kReference / "tinyshakespeare.ids");
  Ids expected(raw.size() / 4);
  std::memcpy(expected.data(), raw.data(), expected.size() * 4);
  ASSERT_EQ(expected.size(), 338025u);  // nanoGPT's shakespeare/prepare.py: 301,966 train + 36,059 val

  // A fresh tokenizer, so that the first pass runs with an empty cache.
  const auto tokenizer = make(openai_files());
  // Timed in this thread's CPU time: encode runs on the calling thread, and on a shared machine
  // wall time mostly measures the neighbours.
  const auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
  };
  const auto timed_encode = [&](Ids& ids) {
    const double start = cpu_seconds();
    ids = tokenizer->encode(text);
    return cpu_seconds() - start;
  };
  Ids cold_ids, warm_ids;
  const double cold = timed_encode(cold_ids);
  const double warm = timed_encode(warm_ids);
  EXPECT_TRUE(cold_ids == expected)
      << "first difference at token "
      << (std::mismatch(cold_ids.begin(), cold_ids.end(), expected.begin(), expected.end()).first - cold_ids.begin());
  EXPECT_TRUE(warm_ids == expected);
  EXPECT_TRUE(tokenizer->decode(cold_ids) == text);
  const double mb = static_cast<double>(text.size()) / 1e6;
  std::printf(
      "[ speed    ] gpt2-bpe encode of tinyshakespeare (%.2f MB, %zu tokens): %.1f MB/s with an empty cache, "
      "%.1f MB/s warm (thread CPU time)\n",
      mb, cold_ids.size(), mb / cold, mb / warm);

  // The cache changes the speed, not the ids.
  loom::Value uncached = openai_files();
  uncached.set("cache_size", 0);
  EXPECT_TRUE(make(uncached)->encode(text) == expected);
}

TEST_F(Gpt2BpeTest, TokenizerJsonGivesTheSameIdsAsOpenAisFiles) {
  if (auto why = missing_reference("tokenizer.json"); !why.empty()) GTEST_SKIP() << why;
  const auto hf = make(tokenizer_json(kReference / "tokenizer.json"));  // merges written as [left, right]
  EXPECT_EQ(hf->vocab_size(), 50257);
  EXPECT_EQ(hf->end_of_text(), std::optional<std::int32_t>(50256));
  const json cases = json::parse(read_file(kReference / "cases.json"));
  for (const auto& c : cases)
    EXPECT_EQ(hf->encode(c["text"].get<std::string>()), c["ids"].get<Ids>()) << "case " << c["name"];
  const std::string text = read_file(kData / "tinyshakespeare.txt");
  EXPECT_TRUE(hf->encode(text) == gpt2().encode(text));
}

TEST_F(Gpt2BpeTest, SmallTokenizerJsonEncodesAsTheReferenceDoes) {
  if (auto why = missing_reference("small_tokenizer.json"); !why.empty()) GTEST_SKIP() << why;
  const auto small = make(tokenizer_json(kReference / "small_tokenizer.json"));  // merges written as "left right"
  EXPECT_EQ(small->vocab_size(), 256 + 2000 + 1);
  EXPECT_EQ(small->end_of_text(), std::optional<std::int32_t>(2256));
  const json cases = json::parse(read_file(kReference / "small_cases.json"));
  for (const auto& c : cases) {
    const std::string text = c["text"];
    const Ids expected = c["ids"].get<Ids>();
    EXPECT_EQ(small->encode(text), expected) << "case " << c["name"] << ": " << c["text"].dump();
    EXPECT_EQ(small->decode(expected), text);
  }
}

TEST_F(Gpt2BpeTest, DecodeInvertsEncodeOnAnyBytes) {
  const std::vector<std::string> texts = {
      "Plain ASCII, with punctuation!?",
      "Unicode: caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 \xd0\x9f\xd1\x80\xd0\xb8",
      "  spaces\t\ttabs\n\nnewlines \r\n  trailing   ",
      "not UTF-8: \xff\xfe\xc0\xaf \xed\xa0\x80 \xe6\x97 end",
      std::string("nul \0 inside", 12),
      "<|endoftext|>doc two<|endoftext|>",
  };
  for (const auto& text : texts) EXPECT_EQ(gpt2().decode(gpt2().encode(text)), text);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    std::string text(static_cast<std::size_t>(trial), '\0');
    for (char& ch : text) ch = static_cast<char>(byte(rng));
    const Ids ids = gpt2().encode(text);
    for (auto id : ids) ASSERT_TRUE(id >= 0 && id < 50257);
    ASSERT_EQ(gpt2().decode(ids), text) << "trial " << trial;
  }
}

TEST_F(Gpt2BpeTest, SpecialTokensCanBeEncodedAsText) {
  loom::Value node = openai_files();
  node.set("recognize_special_tokens", false);
  const auto plain = make(node);
  const Ids ids = plain->encode("a<|endoftext|>b");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 50256), 0);
  EXPECT_EQ(plain->decode(ids), "a<|endoftext|>b");
  EXPECT_EQ(plain->end_of_text(), std::optional<std::int32_t>(50256));
  EXPECT_EQ(gpt2().encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
}

TEST_F(Gpt2BpeTest, EndOfTextCanBeRenamedOrNone) {
  loom::Value none = openai_files();
  none.set("end_of_text", "");
  EXPECT_FALSE(make(none)->end_of_text().has_value());
  EXPECT_NE(make(none)->encode("<|endoftext|>").size(), 1u);  // no special token left to recognise

  loom::Value missing = openai_files();
  missing.set("end_of_text", "</s>");
  const std::string message = user_error(missing);
  EXPECT_TRUE(contains(message, "\"</s>\" is not in the vocabulary")) << message;
  EXPECT_TRUE(contains(message, "end_of_text")) << message;
}

TEST_F(Gpt2BpeTest, ConcurrentEncodesAgree) {
  const std::string text = read_file(kData / "tinyshakespeare.txt").substr(0, 200000);
  const auto tokenizer = make(openai_files());
  Ids a, b;
  std::thread t1([&] { a = tokenizer->encode(text); });
  std::thread t2([&] { b = tokenizer->encode(text); });
  t1.join();
  t2.join();
  EXPECT_TRUE(a == b);
  EXPECT_TRUE(a == gpt2().encode(text));
}

TEST_F(Gpt2BpeTest, AddedTokensMayStripWhitespace) {
  if (auto why = missing_reference("small_tokenizer.json"); !why.empty()) GTEST_SKIP() << why;
  json hf = json::parse(read_file(kReference / "small_tokenizer.json"));
  hf["added_tokens"].push_back({{"id", 5000}, {"content", "<mask>"}, {"lstrip", true}, {"rstrip", false}});
  hf["added_tokens"].push_back({{"id", 5001}, {"content", "<sep>"}, {"lstrip", false}, {"rstrip", true}});
  TempDir dir;
  write_file(dir.path() / "tokenizer.json", hf.dump());
  const auto t = make(tokenizer_json(dir.path() / "tokenizer.json"));
  EXPECT_EQ(t->vocab_size(), 5002);
  const Ids a = t->encode("a");
  const Ids b = t->encode("b");
  EXPECT_EQ(t->encode("a \t<mask>b"), (Ids{a[0], 5000, b[0]}));
  EXPECT_EQ(t->encode("a<sep> \n b"), (Ids{a[0], 5001, b[0]}));
  // An id without a token is refused by decode, as is one beyond the vocabulary.
  EXPECT_THROW(t->decode(Ids{4000}), loom::UserError);
}

TEST_F(Gpt2BpeTest, DecodingAnIdOutsideTheVocabularyIsAUserError) {
  try {
    gpt2().decode(Ids{15496, 50257});
    FAIL() << "expected a UserError";
  } catch (const loom::UserError& e) {
    EXPECT_TRUE(contains(e.what(), "token id 50257 at position 1 is outside the vocabulary [0, 50257)")) << e.what();
  }
  EXPECT_THROW(gpt2().decode(Ids{-3}), loom::UserError);
}

TEST_F(Gpt2BpeTest, SourcesMustBeGivenExactlyOnce) {
  EXPECT_TRUE(contains(user_error(loom::Value::map()), "no vocabulary given"));
  loom::Value both = openai_files();
  both.set("tokenizer_json", "tokenizer.json");
  EXPECT_TRUE(contains(user_error(both), "not both"));
  loom::Value half = loom::Value::map();
  half.set("encoder_json", kEncoderJson);
  EXPECT_TRUE(contains(user_error(half), "`encoder_json` is set but `vocab_bpe` is not"));
}

TEST_F(Gpt2BpeTest, MissingFilesAreUserErrorsNamingThePath) {
  loom::Value node = openai_files();
  node.set("encoder_json", "no/such/encoder.json");
  std::string message = user_error(node);
  EXPECT_TRUE(contains(message, "encoder_json file 'no/such/encoder.json' does not exist")) << message;
  EXPECT_TRUE(contains(message, "relative to the current directory")) << message;
  EXPECT_TRUE(contains(message, "while creating tokenizer 'gpt2-bpe'")) << message;

  node = openai_files();
  node.set("vocab_bpe", "/nonexistent/vocab.bpe");
  message = user_error(node);
  EXPECT_TRUE(contains(message, "vocab_bpe file '/nonexistent/vocab.bpe' does not exist")) << message;

  message = user_error(tokenizer_json(kData));
  EXPECT_TRUE(contains(message, "is a directory")) << message;
}

TEST_F(Gpt2BpeTest, CorruptFilesAreUserErrorsNamingThePathAndTheProblem) {
  TempDir dir;
  const auto path = [&](const char* name) { return (dir.path() / name).string(); };
  const auto openai = [&](const std::string& encoder, const std::string& vocab) {
    loom::Value node = loom::Value::map();
    node.set("encoder_json", encoder);
    node.set("vocab_bpe", vocab);
    return node;
  };

  write_file(path("broken.json"), "{\"a\": 1,\n \"b\": }");
  std::string message = user_error(openai(path("broken.json"), kVocabBpe));
  EXPECT_TRUE(contains(message, "encoder_json file '" + path("broken.json") + "' is not valid JSON")) << message;
  EXPECT_TRUE(contains(message, "line 2")) << message;
  // Bytes that are not text, after a long run: the message quotes a short excerpt, escaped,
  // where nlohmann's own message holds the raw bytes and all of the run.
  write_file(path("binary.json"), "{\"a\": \"" + std::string(300, 'z') + "\xff\x1b\"}");
  message = user_error(openai(path("binary.json"), kVocabBpe));
  EXPECT_TRUE(contains(message, "is not valid JSON")) << message;
  EXPECT_TRUE(contains(message, "zzz\\xff\\x1b")) << message;
  EXPECT_TRUE(std::all_of(message.begin(), message.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) << message;
  EXPECT_LT(message.size(), 300u) << message;

  write_file(path("list.json"), "[1, 2]");
  message = user_error(openai(path("list.json"), kVocabBpe));
  EXPECT_TRUE(contains(message, "expected a JSON object")) << message;

  write_file(path("bad.bpe"), "#version: 0.2\n\xc4\xa0 t\nthree parts here\n");
  message = user_error(openai(kEncoderJson, path("bad.bpe")));
  EXPECT_TRUE(contains(message, "vocab_bpe file '" + path("bad.bpe") + "'")) << message;
  EXPECT_TRUE(contains(message, "line 3 \"three parts here\": expected a merge")) << message;

  write_file(path("unknown.bpe"), "#version: 0.2\nqqqq zzzz\n");
  message = user_error(openai(kEncoderJson, path("unknown.bpe")));
  EXPECT_TRUE(contains(message, "line 2 \"qqqq zzzz\": \"qqqq\" is not in the vocabulary")) << message;

  // A vocabulary that cannot encode every byte is not byte-level.
  json encoder = json::parse(read_file(kEncoderJson));
  encoder.erase("\xc4\xa0");  // "Ġ", the space byte
  write_file(path("no-space.json"), encoder.dump());
  write_file(path("empty.bpe"), "#version: 0.2\n");
  message = user_error(openai(path("no-space.json"), path("empty.bpe")));
  EXPECT_TRUE(contains(message, "no token for byte 0x20")) << message;

  const auto hf_error = [&](const json& file) {
    write_file(path("tokenizer.json"), file.dump());
    return user_error(tokenizer_json(path("tokenizer.json")));
  };
  json model = {{"type", "BPE"}, {"vocab", json::parse(read_file(kEncoderJson))}, {"merges", json::array()}};
  message = hf_error({{"model", model}, {"pre_tokenizer", {{"type", "Whitespace"}}}});
  EXPECT_TRUE(contains(message, "tokenizer_json file '" + path("tokenizer.json") + "'")) << message;
  EXPECT_TRUE(contains(message, "its pre_tokenizer is {\"type\":\"Whitespace\"}")) << message;
  message = hf_error({{"model", model}, {"normalizer", {{"type", "Lowercase"}}}});
  EXPECT_TRUE(contains(message, "its normalizer is {\"type\":\"Lowercase\"}")) << message;
  json wordpiece = model;
  wordpiece["type"] = "WordPiece";
  EXPECT_TRUE(contains(hf_error({{"model", wordpiece}}), "reads BPE models only"));
  json bad_merge = model;
  bad_merge["merges"] = json::array({"\xc4\xa0 t", 7});
  message = hf_error({{"model", bad_merge}});
  EXPECT_TRUE(contains(message, "model.merges[1] 7: expected")) << message;
  EXPECT_TRUE(contains(hf_error({{"vocab", 1}}), "no \"model\" object"));
  json wordpiece_vocab = {{"type", "BPE"}, {"vocab", {{"##ing", 0}}}, {"merges", json::array()}};
  message = hf_error({{"model", wordpiece_vocab}});
  EXPECT_TRUE(contains(message, "no token for byte 0x00")) << message;
  json not_byte_level = {{"type", "BPE"}, {"vocab", {{"\xe2\x96\x81the", 0}}}, {"merges", json::array()}};
  message = hf_error({{"model", not_byte_level}});
  EXPECT_TRUE(contains(message, "contains U+2581, which is not one of GPT-2's 256 byte symbols")) << message;
}

}  // namespace
