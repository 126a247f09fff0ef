#include <gtest/gtest.h>

#include <set>

#include "dataset_test_support.hpp"

namespace loom::test {
namespace {

Handle<Dataset> preference_dataset(const std::vector<std::string>& paths, Value extra = Value::map()) {
  extra.set("paths", string_list(paths));
  return make_dataset(LOOM_PLUGIN_DIR, "preference", extra);
}

// Pair i: prompt "q<i>:", chosen "yes<i>", rejected "no".
std::string pairs(int n) {
  std::string out;
  for (int i = 0; i < n; ++i)
    out += "{\"prompt\": \"q" + std::to_string(i) + ":\", \"chosen\": \"yes" + std::to_string(i) +
           "\", \"rejected\": \"no\"}\n";
  return out;
}

std::string row_text(const Batch& b, std::int64_t r, bool targets) {
  std::string s;
  for (std::int64_t t = 0; t < b.seq_len; ++t) {
    const auto v = (targets ? b.targets : b.inputs)[static_cast<std::size_t>(r * b.seq_len + t)];
    if (targets && v < 0) continue;
    if (!targets && b.segment_ids[static_cast<std::size_t>(r * b.seq_len + t)] != 0) continue;
    s += v == 256 ? '|' : static_cast<char>(v);
  }
  return s;
}

TEST(PreferenceDataset, RowsArePairsWithTargetsOnTheResponseOnly) {
  TempDir dir;
  const auto file = dir.write("p.jsonl", pairs(10));
  auto tok = std::make_shared<TestTokenizer>(false, true);
  Value extra = Value::map();
  extra.set("validation_fraction", Value(0.2));
  auto ds = preference_dataset({file.string()}, extra);
  ds->prepare(make_setup(tok, 12, 4, 3));
  Batch b;
  std::set<std::string> seen;
  for (int i = 0; i < 4; ++i) {  // 8 training pairs, 2 per batch: one epoch
    ds->batch(Split::train, i, b);
    ASSERT_EQ(b.batch_size, 4);
    ASSERT_EQ(b.seq_len, 12);
    for (std::int64_t p = 0; p < 2; ++p) {
      const std::string chosen = row_text(b, 2 * p, false), rejected = row_text(b, 2 * p + 1, false);
      // Inputs: the prompt and the response less its last token (end of text); targets: the
      // response and its end of text, nothing of the prompt.
      const std::string prompt = chosen.substr(0, chosen.find(':') + 1);
      EXPECT_EQ(rejected, prompt + "no") << chosen;
      EXPECT_EQ(row_text(b, 2 * p + 1, true), "no|");
      const std::string number = prompt.substr(1, prompt.size() - 2);
      EXPECT_EQ(row_text(b, 2 * p, true), "yes" + number + "|");
      seen.insert(number);
    }
  }
  EXPECT_EQ(seen.size(), 8u) << "an epoch visits every training pair once";
  EXPECT_FALSE(seen.contains("8"));  // held out
  ds->batch(Split::validation, 0, b);
  EXPECT_EQ(row_text(b, 0, true), "yes8|");
  EXPECT_EQ(row_text(b, 2, true), "yes9|");

  // Deterministic by (split, index).
  Batch again;
  ds->batch(Split::train, 7, b);
  ds->batch(Split::train, 7, again);
  EXPECT_EQ(b.inputs, again.inputs);
  EXPECT_EQ(b.targets, again.targets);
}

TEST(PreferenceDataset, BadRecordsNameTheFileAndLine) {
  TempDir dir;
  auto tok = std::make_shared<TestTokenizer>(false, true);
  const auto missing = dir.write("m.jsonl", pairs(2) + "{\"prompt\": \"a\", \"chosen\": \"b\"}\n");
  try {
    preference_dataset({missing.string()})->prepare(make_setup(tok, 12, 4));
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("m.jsonl:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("\"rejected\""), std::string::npos) << e.what();
  }
  const auto too_long =
      dir.write("l.jsonl", "{\"prompt\": \"aaaaaaaaaaaa\", \"chosen\": \"b\", \"rejected\": \"c\"}\n");
  try {
    preference_dataset({too_long.string()})->prepare(make_setup(tok, 8, 4));
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("l.jsonl:1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("seq_len"), std::string::npos) << e.what();
  }
  EXPECT_THROW(preference_dataset({missing.string()})->prepare(make_setup(tok, 12, 3)), UserError);  // odd batch
}

// A binary file given as preference data: the message quotes the bytes escaped, never raw.
TEST(PreferenceDataset, ABinaryFileIsQuotedEscaped) {
  TempDir dir;
  auto tok = std::make_shared<TestTokenizer>(false, true);
  const auto png = dir.write("image.jsonl", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe", 18));
  try {
    preference_dataset({png.string()})->prepare(make_setup(tok, 12, 4));
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("image.jsonl:1: not valid JSON"), std::string::npos) << m;
    EXPECT_NE(m.find("\\x89PNG"), std::string::npos) << m;
    EXPECT_TRUE(std::all_of(m.begin(), m.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) << m;
  }
}

}  // namespace
}  // namespace loom::test
