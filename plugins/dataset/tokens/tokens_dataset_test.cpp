// The `tokens` dataset over shards, and the round trip `loom tokenize` -> `tokens` against the
// text datasets that read the same files.
#include <gtest/gtest.h>

#include "dataset_test_support.hpp"
#include "loom/run/tokenize.hpp"
#include "loom/token_shard.hpp"

namespace loom::test {
namespace {

Handle<Dataset> tokens_dataset(const std::vector<std::string>& paths, Value extra = Value::map()) {
  extra.set("paths", string_list(paths));
  return make_dataset(LOOM_PLUGIN_DIR, "tokens", extra);
}
Handle<Dataset> named_dataset(const std::string& name, const std::vector<std::string>& paths,
                              Value extra = Value::map()) {
  extra.set("paths", string_list(paths));
  return make_dataset(LOOM_PLUGIN_DIR, name, extra);
}

Value with(Value v, const char* key, Value x) {
  if (v.is_null()) v = Value::map();
  v.set(key, std::move(x));
  return v;
}

std::string prose(int sentences, int seed) {
  std::mt19937 rng(static_cast<unsigned>(seed));
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "runs", "far"};
  std::string s;
  for (int i = 0; i < sentences; ++i) {
    for (int w = 0; w < 6; ++w) {
      if (w) s += ' ';
      s += words[rng() % 11];
    }
    s += ". ";
  }
  return s;
}

void expect_same_batches(const Dataset& a, const Dataset& b, Split split, int count) {
  Batch x, y;
  for (int i = 0; i < count; ++i) {
    a.batch(split, i, x);
    b.batch(split, i, y);
    ASSERT_EQ(x.inputs, y.inputs) << "batch " << i;
    ASSERT_EQ(x.targets, y.targets) << "batch " << i;
    ASSERT_EQ(x.segment_ids, y.segment_ids) << "batch " << i;
  }
}

TokenizeSummary tokenize(Tokenizer& tok, const std::vector<std::string>& inputs, const std::filesystem::path& out,
                         double fraction = 0, std::int64_t shard_tokens = 100'000'000,
                         std::vector<std::string> validation = {}) {
  TokenizeRequest r;
  r.inputs = inputs;
  r.validation_inputs = std::move(validation);
  r.validation_fraction = fraction;
  r.output_dir = out;
  r.shard_tokens = shard_tokens;
  return tokenize_corpus(tok, r, nullptr);
}

// The shards of `loom tokenize` hold exactly the stream the text dataset packs, so the tokens
// dataset gives the same batches, validation fraction included.
TEST(TokensDataset, RoundTripMatchesTheTextDataset) {
  TempDir dir;
  std::vector<std::string> files;
  for (int i = 0; i < 5; ++i) files.push_back(dir.write("in/" + std::to_string(i) + ".txt", prose(30 + i, i)).string());
  TestTokenizer tok(false, true);
  const TokenizeSummary s = tokenize(tok, files, dir.path() / "out", 0.1);
  ASSERT_EQ(s.train_shards.size(), 1u);
  ASSERT_EQ(s.validation_shards.size(), 1u);
  EXPECT_EQ(s.train_shards[0].filename(), "train-00000.bin");
  EXPECT_EQ(s.validation_shards[0].filename(), "validation-00000.bin");
  EXPECT_EQ(s.documents, 5);

  auto shared = std::make_shared<TestTokenizer>(false, true);
  auto text = named_dataset("text", files);
  auto tokens = tokens_dataset({s.train_shards[0].string()},
                               with(Value::map(), "validation_paths", string_list({s.validation_shards[0].string()})));
  text->prepare(make_setup(shared, 32, 4, 21));
  tokens->prepare(make_setup(shared, 32, 4, 21));
  EXPECT_EQ(text->num_tokens(Split::train), s.train_tokens);
  EXPECT_EQ(text->num_tokens(Split::validation), s.validation_tokens);
  EXPECT_EQ(tokens->num_tokens(Split::train), s.train_tokens);
  expect_same_batches(*text, *tokens, Split::train, 50);
  expect_same_batches(*text, *tokens, Split::validation, 10);

  // The same split made by the tokens dataset's own validation_fraction over all the tokens.
  const TokenizeSummary all = tokenize(tok, files, dir.path() / "all");
  auto fraction = tokens_dataset({all.train_shards[0].string()});
  fraction->prepare(make_setup(shared, 32, 4, 21));
  expect_same_batches(*text, *fraction, Split::train, 50);
  expect_same_batches(*text, *fraction, Split::validation, 10);
}

TEST(TokensDataset, JsonlRoundTripKeepsDocumentBoundaries) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 60; ++i) lines += "{\"text\": \"" + prose(1 + i % 3, i) + "\"}\n";
  const auto file = dir.write("docs.jsonl", lines);
  TestTokenizer tok(false, true);
  const TokenizeSummary s = tokenize(tok, {file.string()}, dir.path() / "out");
  EXPECT_EQ(s.documents, 60);
  const TokenShard shard = TokenShard::open(s.train_shards.at(0));
  EXPECT_EQ(shard.info().num_documents, 60);
  EXPECT_EQ(shard.info().end_of_text, 256);
  // Every document but the last ends with the end-of-text token.
  for (std::size_t d = 0; d + 1 < shard.document_ends().size(); ++d)
    EXPECT_EQ(shard.token(shard.document_ends()[d] - 1), 256);

  auto shared = std::make_shared<TestTokenizer>(false, true);
  auto jsonl = named_dataset("jsonl", {file.string()});
  auto tokens = tokens_dataset({s.train_shards[0].string()});
  jsonl->prepare(make_setup(shared, 40, 3, 8));
  tokens->prepare(make_setup(shared, 40, 3, 8));
  expect_same_batches(*jsonl, *tokens, Split::train, 30);
  Batch b;
  tokens->batch(Split::train, 0, b);
  expect_segments_follow(b, 256);
}

// Whether a generated "\n" ends a document (Dataset::separator_ends_documents): only when the
// data has several documents and no line break inside one. The shards say what the text says.
TEST(TokensDataset, SeparatorEndsDocumentsAsTheTextDatasetSays) {
  TempDir dir;
  auto tok = std::make_shared<TestTokenizer>();  // no end-of-text token: "\n" separates
  const auto check = [&](const std::string& name, const std::vector<std::string>& texts, bool expected) {
    SCOPED_TRACE(name);
    std::vector<std::string> files;
    for (std::size_t i = 0; i < texts.size(); ++i)
      files.push_back(dir.write(name + "/" + std::to_string(i) + ".txt", texts[i]).string());
    const TokenizeSummary s = tokenize(*tok, files, dir.path() / (name + "-out"));
    auto text = named_dataset("text", files);
    auto tokens = tokens_dataset({s.train_shards.at(0).string()});
    text->prepare(make_setup(tok, 2, 1));
    tokens->prepare(make_setup(tok, 2, 1));
    EXPECT_EQ(text->separator_ends_documents(), expected);
    EXPECT_EQ(tokens->separator_ends_documents(), expected);
    // Unknown unless the shards are read at start-up.
    auto unverified = tokens_dataset({s.train_shards.at(0).string()}, with(Value::map(), "verify", Value(false)));
    unverified->prepare(make_setup(tok, 2, 1));
    EXPECT_FALSE(unverified->separator_ends_documents());
  };
  check("apart", {"one short document", "and another one", "and a third"}, true);
  check("inside", {"one short document", "two lines\nin one", "and a third"}, false);
  check("single", {"one document only, long enough"}, false);
}

TEST(TokensDataset, ManyShardsAndWindowsStayInsideEach) {
  TempDir dir;
  const auto file = dir.write("a.txt", prose(200, 3));
  TestTokenizer tok;
  const TokenizeSummary s = tokenize(tok, {file.string()}, dir.path() / "out", 0.2, 1000);
  const std::int64_t total = static_cast<std::int64_t>(prose(200, 3).size());
  EXPECT_EQ(s.train_tokens + s.validation_tokens, total);
  EXPECT_EQ(s.train_tokens, static_cast<std::int64_t>(static_cast<double>(total) * 0.8));
  EXPECT_GT(s.train_shards.size(), 3u);
  // The shards, concatenated, are the text.
  std::string joined;
  for (const auto* list : {&s.train_shards, &s.validation_shards})
    for (const auto& f : *list) {
      const TokenShard shard = TokenShard::open(f);
      EXPECT_LE(shard.info().num_tokens, 1000);
      for (std::int64_t i = 0; i < shard.info().num_tokens; ++i) joined += static_cast<char>(shard.token(i));
    }
  EXPECT_EQ(joined, prose(200, 3));

  auto ds = tokens_dataset(
      {(dir.path() / "out" / "train-*.bin").string()},
      with(Value::map(), "validation_paths", string_list({(dir.path() / "out" / "validation-*.bin").string()})));
  ds->prepare(make_setup(std::make_shared<TestTokenizer>(), 64, 8, 2));
  EXPECT_EQ(ds->num_tokens(Split::train), s.train_tokens);
  EXPECT_EQ(ds->num_tokens(Split::validation), s.validation_tokens);
  Batch b;
  for (int i = 0; i < 20; ++i) {
    ds->batch(Split::train, i, b);
    expect_well_formed(b, 8, 64);
    for (std::int64_t r = 0; r < 8; ++r) {
      const auto w = window(b, r);
      EXPECT_NE(prose(200, 3).find(std::string(w.begin(), w.end())), std::string::npos);
    }
  }
}

TEST(TokensDataset, CharTokenizerStateTravelsWithTheShards) {
  TempDir dir;
  const auto file = dir.write("a.txt", prose(100, 4));
  TestTokenizer fitted(true);
  const TokenizeSummary s = tokenize(fitted, {file.string()}, dir.path() / "out");
  ASSERT_TRUE(s.tokenizer_state.has_value());
  EXPECT_EQ(s.tokenizer_state->filename(), "tokenizer.state");
  auto fresh = std::make_shared<TestTokenizer>(true);
  auto ds = tokens_dataset({s.train_shards[0].string()});
  ds->prepare(make_setup(fresh, 16, 2));
  EXPECT_EQ(fresh->vocab_size(), fitted.vocab_size());
  EXPECT_EQ(fresh->state(), fitted.state());
  // Without the state file the tokens dataset cannot know the vocabulary.
  std::filesystem::remove(*s.tokenizer_state);
  auto again = tokens_dataset({s.train_shards[0].string()});
  const std::string e = user_error([&] { again->prepare(make_setup(std::make_shared<TestTokenizer>(true), 16, 2)); });
  EXPECT_NE(e.find("tokenizer.state"), std::string::npos) << e;
}

TEST(TokensDataset, BadDataIsAClearUserError) {
  TempDir dir;
  const auto file = dir.write("a.txt", prose(50, 5));
  TestTokenizer tok;
  const TokenizeSummary s = tokenize(tok, {file.string()}, dir.path() / "out");
  const std::string shard = s.train_shards.at(0).string();
  auto byte_tok = std::make_shared<TestTokenizer>();
  // Missing shard.
  std::string e = user_error([&] { tokens_dataset({shard + ".nope"})->prepare(make_setup(byte_tok, 8, 1)); });
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;
  // Token ids outside the model's vocabulary (letters are above 96).
  e = user_error([&] { tokens_dataset({shard})->prepare(make_setup(byte_tok, 8, 1, 1, 96)); });
  EXPECT_NE(e.find("outside the model's vocabulary of 96"), std::string::npos) << e;
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  // Another tokenizer than the one that wrote the shards.
  e = user_error(
      [&] { tokens_dataset({shard})->prepare(make_setup(std::make_shared<TestTokenizer>(false, true), 8, 1)); });
  EXPECT_NE(e.find("tokenizer of 256 ids, but the configured tokenizer has 257"), std::string::npos) << e;
  // Shorter than one sequence.
  e = user_error([&] { tokens_dataset({shard})->prepare(make_setup(byte_tok, 4096, 1)); });
  EXPECT_NE(e.find("seq_len 4096 needs 4097"), std::string::npos) << e;
  // An empty shard.
  {
    TokenShardWriter w(dir.path() / "empty.bin", 256, std::nullopt);
    w.finish();
  }
  e = user_error([&] { tokens_dataset({(dir.path() / "empty.bin").string()})->prepare(make_setup(byte_tok, 8, 1)); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  // A truncated shard, and a file that is no shard.
  const std::string bytes = [&] {
    std::ifstream in(shard, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  std::ofstream(dir.path() / "cut.bin", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  e = user_error([&] { tokens_dataset({(dir.path() / "cut.bin").string()})->prepare(make_setup(byte_tok, 8, 1)); });
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  EXPECT_NE(e.find("cut.bin"), std::string::npos) << e;
  e = user_error([&] { tokens_dataset({file.string()})->prepare(make_setup(byte_tok, 8, 1)); });
  EXPECT_NE(e.find("bad magic"), std::string::npos) << e;
}

TEST(Tokenize, RefusesToMixWithOldShardsAndBadInputs) {
  TempDir dir;
  const auto file = dir.write("a.txt", prose(20, 1));
  TestTokenizer tok;
  tokenize(tok, {file.string()}, dir.path() / "out");
  std::string e = user_error([&] { tokenize(tok, {file.string()}, dir.path() / "out"); });
  EXPECT_NE(e.find("already holds shards"), std::string::npos) << e;
  TokenizeRequest r;
  r.inputs = {file.string()};
  r.output_dir = dir.path() / "out";
  r.overwrite = true;
  EXPECT_NO_THROW(tokenize_corpus(tok, r, nullptr));
  e = user_error([&] { tokenize(tok, {(dir.path() / "missing.txt").string()}, dir.path() / "o2"); });
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;
  const auto empty = dir.write("empty.txt", "");
  e = user_error([&] { tokenize(tok, {empty.string()}, dir.path() / "o3"); });
  EXPECT_NE(e.find("the corpus is empty"), std::string::npos) << e;
  const auto bad = dir.write("bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 3}\n");
  e = user_error([&] { tokenize(tok, {bad.string()}, dir.path() / "o4"); });
  EXPECT_NE(e.find("bad.jsonl:2: field \"text\" is a number"), std::string::npos) << e;
  e = user_error([&] { tokenize(tok, {file.string()}, dir.path() / "o5", 0.1, 1000, {file.string()}); });
  EXPECT_NE(e.find("not both"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::test
