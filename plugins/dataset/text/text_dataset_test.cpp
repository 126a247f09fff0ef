#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <thread>

#include "dataset_test_support.hpp"
#include "loom/random.hpp"
#include "loom/text_corpus.hpp"
#include "loom/token_windows.hpp"

namespace loom::test {
namespace {

// Text with no repeated window, so a window's content says where it came from.
std::string numbered_text(int lines) {
  std::string s;
  for (int i = 0; i < lines; ++i) s += "line " + std::to_string(i) + " of the text;";
  return s;
}

// Random letters: every window of 11 or more is unique, so its position can be found.
std::string random_text(std::size_t n, unsigned seed = 1) {
  std::mt19937 rng(seed);
  std::string s(n, ' ');
  for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

Handle<Dataset> text_dataset(const std::vector<std::string>& paths, Value extra = Value::map()) {
  extra.set("paths", string_list(paths));
  return make_dataset(LOOM_PLUGIN_DIR, "text", extra);
}

Value options(std::initializer_list<std::pair<const char*, Value>> items) {
  Value v = Value::map();
  for (const auto& [k, x] : items) v.set(k, x);
  return v;
}

TEST(TextDataset, SameSeedSameBatchesAndIndexChangesThem) {
  TempDir dir;
  const auto file = dir.write("a.txt", numbered_text(200));
  auto tok = std::make_shared<TestTokenizer>();
  auto a = text_dataset({file.string()});
  auto b = text_dataset({file.string()});
  a->prepare(make_setup(tok, 32, 4, 7));
  b->prepare(make_setup(tok, 32, 4, 7));
  Batch x, y, z;
  for (int i : {0, 1, 5, 1000}) {
    a->batch(Split::train, i, x);
    b->batch(Split::train, i, y);
    EXPECT_EQ(x.inputs, y.inputs) << "batch " << i;
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.segment_ids, y.segment_ids);
  }
  a->batch(Split::train, 0, x);
  a->batch(Split::train, 1, y);
  EXPECT_NE(x.inputs, y.inputs);
  auto c = text_dataset({file.string()});
  c->prepare(make_setup(tok, 32, 4, 8));
  c->batch(Split::train, 0, z);
  EXPECT_NE(x.inputs, z.inputs) << "another seed should give another order";
}

TEST(TextDataset, WindowsAreContiguousSlicesWithTargetsShiftedByOne) {
  TempDir dir;
  const std::string text = numbered_text(100);
  const auto file = dir.write("a.txt", text);
  auto ds = text_dataset({file.string()}, options({{"validation_fraction", Value(0.0)}}));
  ds->prepare(make_setup(std::make_shared<TestTokenizer>(), 16, 8, 3));
  Batch b;
  for (int i = 0; i < 10; ++i) {
    ds->batch(Split::train, i, b);
    expect_well_formed(b, 8, 16);
    for (std::int64_t r = 0; r < 8; ++r) {
      const auto w = window(b, r);
      const std::string s(w.begin(), w.end());
      EXPECT_NE(text.find(s), std::string::npos) << "row " << r << " of batch " << i << " is not a slice: " << s;
    }
  }
}

TEST(TextDataset, AnEpochVisitsEveryWindowOnce) {
  TempDir dir;
  const std::string text = random_text(1004);
  const auto file = dir.write("a.txt", text);
  const std::int64_t seq_len = 10;
  const std::int64_t windows = (static_cast<std::int64_t>(text.size()) - 1) / seq_len;  // 100, slack 3
  for (const bool offsets : {false, true}) {
    auto ds = text_dataset({file.string()},
                           options({{"validation_fraction", Value(0.0)}, {"random_offsets", Value(offsets)}}));
    ds->prepare(make_setup(std::make_shared<TestTokenizer>(), seq_len, 1, 11));
    std::set<std::size_t> starts;
    std::set<std::size_t> residues;
    Batch b;
    // Random offsets give up one window when the slack is too small for every offset.
    const std::int64_t per_epoch = offsets ? windows - 1 : windows;
    for (std::int64_t i = 0; i < per_epoch; ++i) {
      ds->batch(Split::train, i, b);
      const auto w = window(b, 0);
      const std::size_t at = text.find(std::string(w.begin(), w.end()));
      ASSERT_NE(at, std::string::npos);
      starts.insert(at);
      residues.insert(at % seq_len);
    }
    EXPECT_EQ(starts.size(), static_cast<std::size_t>(per_epoch)) << "a window repeated within an epoch";
    EXPECT_EQ(residues.size(), 1u) << "one epoch uses one grid";
    if (!offsets) {
      EXPECT_EQ(*residues.begin(), 0u);
    }
  }
}

// docs/datasets.md gives the order as a formula of the run's seed; it must be the one the code
// uses. The trainer hands the dataset stream_key(seed, 2, 0) (DatasetSetup::seed).
TEST(TextDataset, TheOrderIsTheDocumentedFormula) {
  const std::string doc = "stream_key(stream_key(seed, 2, 0), 2, split)";
  std::ifstream in(std::filesystem::path(LOOM_SOURCE_DIR) / "docs" / "datasets.md");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("`key` is `" + doc + "`"), std::string::npos) << "docs/datasets.md no longer says " << doc;

  TempDir dir;
  const std::string corpus = random_text(2004);
  const auto file = dir.write("a.txt", corpus);
  const std::int64_t seq_len = 10, run_seed = 42;
  auto ds =
      text_dataset({file.string()}, options({{"validation_fraction", Value(0.5)}, {"random_offsets", Value(false)}}));
  ds->prepare(make_setup(std::make_shared<TestTokenizer>(), seq_len, 1, stream_key(run_seed, 2, 0)));
  const std::size_t half = corpus.size() / 2;  // 1002 tokens per split: 100 windows each
  for (const Split split : {Split::train, Split::validation}) {
    const std::uint64_t key = stream_key(stream_key(run_seed, 2, 0), 2, split == Split::train ? 0 : 1);
    const std::string stream = split == Split::train ? corpus.substr(0, half) : corpus.substr(half);
    Batch b;
    for (const std::int64_t sample : {0, 1, 7, 99, 100, 101, 250}) {
      const std::uint64_t epoch = static_cast<std::uint64_t>(sample / 100);
      const std::uint64_t window =
          permute_index(static_cast<std::uint64_t>(sample % 100), 100, hash_u64(key ^ hash_u64(epoch + 1)));
      ds->batch(split, sample, b);
      const auto w = loom::test::window(b, 0);
      EXPECT_EQ(std::string(w.begin(), w.end()), stream.substr(window * seq_len, seq_len + 1))
          << (split == Split::train ? "train" : "validation") << " sample " << sample;
    }
  }
}

TEST(TextDataset, ValidationFractionIsTheLastPartOfTheStream) {
  TempDir dir;
  const std::string text = random_text(1890);
  const auto file = dir.write("a.txt", text);
  const auto n = static_cast<std::int64_t>(text.size());
  auto ds = text_dataset({file.string()}, options({{"validation_fraction", Value(0.25)}}));
  ds->prepare(make_setup(std::make_shared<TestTokenizer>(), 16, 2));
  const auto keep = static_cast<std::int64_t>(static_cast<double>(n) * 0.75);
  EXPECT_EQ(ds->num_tokens(Split::train), keep);
  EXPECT_EQ(ds->num_tokens(Split::validation), n - keep);
  Batch b;
  for (int i = 0; i < 20; ++i) {
    ds->batch(Split::validation, i, b);
    expect_well_formed(b, 2, 16);
    for (std::int64_t r = 0; r < 2; ++r) {
      const auto w = window(b, r);
      const std::size_t at = text.find(std::string(w.begin(), w.end()), static_cast<std::size_t>(keep));
      EXPECT_NE(at, std::string::npos) << "validation windows come from the last quarter";
    }
    ds->batch(Split::train, i, b);
    for (std::int64_t r = 0; r < 2; ++r) {
      const auto w = window(b, r);
      const std::size_t at = text.find(std::string(w.begin(), w.end()));
      EXPECT_LE(at + 17, static_cast<std::size_t>(keep)) << "training windows stay in the first three quarters";
    }
  }
  // The default is nanoGPT's 10%.
  auto def = text_dataset({file.string()});
  def->prepare(make_setup(std::make_shared<TestTokenizer>(), 16, 2));
  EXPECT_EQ(def->num_tokens(Split::train), static_cast<std::int64_t>(static_cast<double>(n) * 0.9));
}

TEST(TextDataset, ValidationByFileAndNone) {
  TempDir dir;
  const auto a = dir.write("train/a.txt", numbered_text(30));
  const auto b = dir.write("train/b.txt", numbered_text(20));
  const auto v = dir.write("valid.txt", numbered_text(10));
  auto tok = std::make_shared<TestTokenizer>(false, true);
  auto ds = text_dataset({(dir.path() / "train" / "*.txt").string()},
                         options({{"validation_paths", string_list({v.string()})}}));
  ds->prepare(make_setup(tok, 8, 2));
  // Two documents joined by one end-of-text token.
  EXPECT_EQ(ds->num_tokens(Split::train),
            static_cast<std::int64_t>(numbered_text(30).size() + 1 + numbered_text(20).size()));
  EXPECT_EQ(ds->num_tokens(Split::validation), static_cast<std::int64_t>(numbered_text(10).size()));

  auto none = text_dataset({a.string()}, options({{"validation_fraction", Value(0.0)}}));
  none->prepare(make_setup(tok, 8, 2));
  EXPECT_EQ(none->num_tokens(Split::validation), 0);
  Batch batch;
  EXPECT_NE(user_error([&] { none->batch(Split::validation, 0, batch); }).find("no validation split"),
            std::string::npos);
}

TEST(TextDataset, SegmentIdsResetAtFileBoundaries) {
  TempDir dir;
  std::vector<std::string> files;
  for (int i = 0; i < 12; ++i) {
    std::string name = "f", text = "document ";
    name += std::to_string(i);
    name += ".txt";
    text += std::to_string(i);
    files.push_back(dir.write(name, text).string());
  }
  // With an end-of-text token it separates documents; without one a newline does.
  for (const bool eot : {true, false}) {
    auto tok = std::make_shared<TestTokenizer>(false, eot);
    auto ds = text_dataset(files, options({{"validation_fraction", Value(0.0)}}));
    ds->prepare(make_setup(tok, 24, 4));
    const std::int32_t separator = eot ? 256 : '\n';
    Batch b;
    int boundaries = 0;
    for (int i = 0; i < 8; ++i) {
      ds->batch(Split::train, i, b);
      expect_well_formed(b, 4, 24);
      expect_segments_follow(b, separator);
      boundaries += static_cast<int>(std::count(b.inputs.begin(), b.inputs.end(), separator));
    }
    EXPECT_GT(boundaries, 0) << "rows of 24 tokens over documents of ~10 should cross boundaries";
  }
}

TEST(TextDataset, FitsATokenizerThatNeedsIt) {
  TempDir dir;
  const auto file = dir.write("a.txt", "abcabcabcabcabcabcabcabcabcabcabcabcabcabc");
  auto tok = std::make_shared<TestTokenizer>(true);
  auto ds = text_dataset({file.string()}, options({{"validation_fraction", Value(0.0)}}));
  ds->prepare(make_setup(tok, 8, 2));
  EXPECT_EQ(tok->fits, 1);
  EXPECT_EQ(tok->vocab_size(), 3);
  Batch b;
  ds->batch(Split::train, 0, b);
  for (const auto id : b.inputs) EXPECT_LT(id, 3);
}

TEST(TextDataset, ConcurrentBatchesMatchSequentialOnes) {
  TempDir dir;
  const auto file = dir.write("a.txt", numbered_text(300));
  auto ds = text_dataset({file.string()});
  ds->prepare(make_setup(std::make_shared<TestTokenizer>(), 32, 4, 5));
  std::vector<Batch> sequential(64), parallel(64);
  for (int i = 0; i < 64; ++i) ds->batch(Split::train, i, sequential[i]);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = t; i < 64; i += 4) ds->batch(Split::train, i, parallel[i]);
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 64; ++i) EXPECT_EQ(sequential[i].inputs, parallel[i].inputs);
}

TEST(TextDataset, BadDataIsAClearUserError) {
  TempDir dir;
  auto tok = std::make_shared<TestTokenizer>();
  Batch b;
  // Missing file.
  auto missing = text_dataset({(dir.path() / "nope.txt").string()});
  std::string e = user_error([&] { missing->prepare(make_setup(tok, 8, 1)); });
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;
  EXPECT_NE(e.find("nope.txt"), std::string::npos) << e;
  EXPECT_NE(e.find("data.paths"), std::string::npos) << e;
  // A glob matching nothing.
  auto glob = text_dataset({(dir.path() / "*.md").string()});
  e = user_error([&] { glob->prepare(make_setup(tok, 8, 1)); });
  EXPECT_NE(e.find("matches no file"), std::string::npos) << e;
  // Empty corpus.
  const auto empty = dir.write("empty.txt", "");
  auto none = text_dataset({empty.string()});
  e = user_error([&] { none->prepare(make_setup(tok, 8, 1)); });
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  EXPECT_NE(e.find("empty.txt"), std::string::npos) << e;
  // Shorter than one sequence.
  const auto tiny = dir.write("tiny.txt", "just a few words");
  auto short_ds = text_dataset({tiny.string()}, options({{"validation_fraction", Value(0.0)}}));
  e = user_error([&] { short_ds->prepare(make_setup(tok, 64, 1)); });
  EXPECT_NE(e.find("has 16 tokens"), std::string::npos) << e;
  EXPECT_NE(e.find("seq_len 64 needs 65"), std::string::npos) << e;
  EXPECT_NE(e.find("tiny.txt"), std::string::npos) << e;
  // A validation part shorter than one sequence.
  const auto small = dir.write("small.txt", numbered_text(5));
  auto small_val = text_dataset({small.string()}, options({{"validation_fraction", Value(0.05)}}));
  e = user_error([&] { small_val->prepare(make_setup(tok, 32, 1)); });
  EXPECT_NE(e.find("validation split"), std::string::npos) << e;
  // A token id outside the model's vocabulary ('z' is 122).
  const auto text = dir.write("z.txt", numbered_text(5) + "zzz");
  auto vocab = text_dataset({text.string()});
  e = user_error([&] { vocab->prepare(make_setup(tok, 8, 1, 1, 100)); });
  EXPECT_NE(e.find("token id 122"), std::string::npos) << e;
  EXPECT_NE(e.find("vocabulary of 100"), std::string::npos) << e;
  // No tokenizer.
  auto no_tok = text_dataset({text.string()});
  e = user_error([&] { no_tok->prepare(make_setup(nullptr, 8, 1)); });
  EXPECT_NE(e.find("tokenizer"), std::string::npos) << e;
  // An unknown option is caught by the registry, with the closest one.
  e = user_error([&] { text_dataset({text.string()}, options({{"validation_fractoin", Value(0.1)}})); });
  EXPECT_NE(e.find("validation_fraction"), std::string::npos) << e;
}

TEST(TextDataset, Shakespeare) {
  const std::filesystem::path file = LOOM_TINYSHAKESPEARE;  // configs/data/tinyshakespeare.txt
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  auto tok = std::make_shared<TestTokenizer>(true);
  auto ds = text_dataset({file.string()});
  ds->prepare(make_setup(tok, 64, 12, 1337, 65));
  // nanoGPT's shakespeare_char: 65 characters, 1,003,854 training and 111,540 validation tokens.
  EXPECT_EQ(tok->vocab_size(), 65);
  EXPECT_EQ(ds->num_tokens(Split::train), 1003854);
  EXPECT_EQ(ds->num_tokens(Split::validation), 111540);
  Batch b;
  ds->batch(Split::validation, 0, b);
  expect_well_formed(b, 12, 64);
}

// The real `char` tokenizer plugin on nanoGPT's recipe, when it is built.
TEST(TextDataset, ShakespeareWithTheCharTokenizerPlugin) {
  const std::filesystem::path file = LOOM_TINYSHAKESPEARE;  // configs/data/tinyshakespeare.txt
  ASSERT_TRUE(std::filesystem::exists(file)) << file;
  auto tok = plugin_tokenizer(LOOM_PLUGIN_DIR, "char");
  if (!tok) GTEST_SKIP() << "the char tokenizer plugin is not built";
  auto ds = text_dataset({file.string()});
  ds->prepare(make_setup(tok, 64, 12, 1337, 65));
  EXPECT_EQ(tok->vocab_size(), 65);
  EXPECT_EQ(ds->num_tokens(Split::train), 1003854);
  EXPECT_EQ(ds->num_tokens(Split::validation), 111540);
  Batch b;
  ds->batch(Split::train, 0, b);
  expect_well_formed(b, 12, 64);
  const std::string text = read_text_file(file);
  const std::string row = tok->decode(window(b, 0));
  EXPECT_NE(text.find(row), std::string::npos) << row;
}

}  // namespace
}  // namespace loom::test
