#include <gtest/gtest.h>

#include <algorithm>
#include <regex>

#include "dataset_test_support.hpp"

namespace loom::test {
namespace {

Handle<Dataset> jsonl_dataset(const std::vector<std::string>& paths, Value extra = Value::map()) {
  extra.set("paths", string_list(paths));
  return make_dataset(LOOM_PLUGIN_DIR, "jsonl", extra);
}

// {"text": "..."} lines; documents "doc <i>: " followed by i % 7 + 3 words.
std::string jsonl_lines(int n, int first = 0, const std::string& field = "text") {
  std::string out;
  for (int i = first; i < first + n; ++i) {
    std::string doc = "doc " + std::to_string(i) + ":";
    for (int w = 0; w < i % 7 + 3; ++w) doc += " w" + std::to_string(w);
    out += "{\"id\": " + std::to_string(i) + ", \"" + field + "\": \"" + doc + "\"}\n";
  }
  return out;
}

TEST(JsonlDataset, DocumentsAreSeparatedByEndOfTextAndSegmentIds) {
  TempDir dir;
  const auto file = dir.write("a.jsonl", jsonl_lines(200));
  auto tok = std::make_shared<TestTokenizer>(false, true);
  auto ds = jsonl_dataset({file.string()}, [] {
    Value v = Value::map();
    v.set("validation_fraction", Value(0.0));
    return v;
  }());
  ds->prepare(make_setup(tok, 48, 6, 3));
  Batch b;
  for (int i = 0; i < 10; ++i) {
    ds->batch(Split::train, i, b);
    expect_well_formed(b, 6, 48);
    expect_segments_follow(b, 256);
    // Inside one segment, the text belongs to one document: "doc " appears at most once, and
    // only at the segment's start.
    for (std::int64_t r = 0; r < 6; ++r) {
      std::map<int, std::string> segments;
      for (std::int64_t t = 0; t < 48; ++t) {
        const auto k = static_cast<std::size_t>(r * 48 + t);
        if (b.inputs[k] != 256) segments[b.segment_ids[k]] += static_cast<char>(b.inputs[k]);
      }
      for (const auto& [id, text] : segments) {
        const auto at = text.find("doc ");
        if (at != std::string::npos) {
          EXPECT_EQ(at, 0u) << text;
          EXPECT_EQ(text.find("doc ", 1), std::string::npos) << text;
        }
      }
    }
  }
  // 200 documents and 199 separators.
  std::int64_t chars = 0;
  for (int i = 0; i < 200; ++i) {
    chars += static_cast<std::int64_t>(("doc " + std::to_string(i) + ":").size());
    for (int w = 0; w < i % 7 + 3; ++w) chars += static_cast<std::int64_t>((" w" + std::to_string(w)).size());
  }
  EXPECT_EQ(ds->num_tokens(Split::train), chars + 199);
}

TEST(JsonlDataset, DeterministicBySeedAndIndex) {
  TempDir dir;
  const auto file = dir.write("a.jsonl", jsonl_lines(300));
  auto tok = std::make_shared<TestTokenizer>(false, true);
  auto a = jsonl_dataset({file.string()});
  auto b = jsonl_dataset({file.string()});
  a->prepare(make_setup(tok, 32, 4, 9));
  b->prepare(make_setup(tok, 32, 4, 9));
  Batch x, y;
  for (const auto split : {Split::train, Split::validation}) {
    for (int i : {0, 3, 77}) {
      a->batch(split, i, x);
      b->batch(split, i, y);
      EXPECT_EQ(x.inputs, y.inputs);
      EXPECT_EQ(x.segment_ids, y.segment_ids);
    }
    a->batch(split, 0, x);
    a->batch(split, 1, y);
    EXPECT_NE(x.inputs, y.inputs);
  }
}

TEST(JsonlDataset, TextFieldBlankLinesAndValidationFiles) {
  TempDir dir;
  const auto train = dir.write("train.jsonl", "\n" + jsonl_lines(50, 0, "body") + "\n  \n");
  const auto valid = dir.write("valid.jsonl", jsonl_lines(10, 100, "body"));
  Value v = Value::map();
  v.set("text_field", Value("body"));
  v.set("validation_paths", string_list({valid.string()}));
  auto ds = jsonl_dataset({train.string()}, v);
  auto tok = std::make_shared<TestTokenizer>(false, true);
  ds->prepare(make_setup(tok, 16, 2));
  EXPECT_GT(ds->num_tokens(Split::train), 0);
  EXPECT_GT(ds->num_tokens(Split::validation), 0);
  Batch b;
  ds->batch(Split::validation, 0, b);
  std::string text;
  for (const auto id : b.inputs) text += id == 256 ? '|' : static_cast<char>(id);
  EXPECT_FALSE(std::regex_search(text, std::regex("doc [0-9]{1,2}:")))
      << "validation rows come from documents 100..109: " << text;
}

TEST(JsonlDataset, WithoutEndOfTextANewlineSeparates) {
  TempDir dir;
  const auto file = dir.write("a.jsonl", jsonl_lines(100));
  auto tok = std::make_shared<TestTokenizer>(true);  // fitted, no end of text
  Value v = Value::map();
  v.set("validation_fraction", Value(0.0));
  auto ds = jsonl_dataset({file.string()}, v);
  ds->prepare(make_setup(tok, 32, 4));
  const auto newline = tok->encode("\n");
  ASSERT_EQ(newline.size(), 1u) << "the fitted vocabulary holds the separator";
  Batch b;
  for (int i = 0; i < 5; ++i) {
    ds->batch(Split::train, i, b);
    expect_segments_follow(b, newline[0]);
  }
}

TEST(JsonlDataset, BadLinesAreUserErrorsWithFileAndLine) {
  TempDir dir;
  auto tok = std::make_shared<TestTokenizer>(false, true);
  auto error_for = [&](const std::string& name, const std::string& content, const std::string& field = "text") {
    const auto file = dir.write(name, content);
    Value v = Value::map();
    v.set("text_field", Value(field));
    auto ds = jsonl_dataset({file.string()}, v);
    return user_error([&] { ds->prepare(make_setup(tok, 4, 1)); });
  };
  std::string e = error_for("bad.jsonl", jsonl_lines(2) + "{\"text\": \"unterminated}\n");
  EXPECT_NE(e.find("bad.jsonl:3: not valid JSON"), std::string::npos) << e;
  // A binary or huge line: the message quotes a short excerpt, escaped, where nlohmann's own
  // message holds the raw bytes and all of the run before them.
  e = error_for("binary.jsonl", jsonl_lines(1) + "{\"text\": \"" + std::string(300, 'z') + "\xff\x1b[2J\"}\n");
  EXPECT_NE(e.find("binary.jsonl:2: not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("zzz\\xff\\x1b[2J"), std::string::npos) << e;
  EXPECT_TRUE(std::all_of(e.begin(), e.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) << e;
  EXPECT_LT(e.size(), 300u) << e;
  e = error_for("control.jsonl", "{\"te\\u001bxt\": \"x\"}\n");
  EXPECT_NE(e.find("the object has te\\x1bxt)"), std::string::npos) << e;
  e = error_for("missing.jsonl", jsonl_lines(1) + "{\"content\": \"x\", \"id\": 2}\n");
  EXPECT_NE(e.find("missing.jsonl:2: no \"text\" field (the object has content, id)"), std::string::npos) << e;
  e = error_for("typo.jsonl", jsonl_lines(3), "txet");
  EXPECT_NE(e.find("did you mean text_field: text?"), std::string::npos) << e;
  e = error_for("number.jsonl", "{\"text\": 12}\n");
  EXPECT_NE(e.find("number.jsonl:1: field \"text\" is a number, expected a string"), std::string::npos) << e;
  e = error_for("array.jsonl", "[1, 2]\n");
  EXPECT_NE(e.find("array.jsonl:1: expected a JSON object"), std::string::npos) << e;
  e = error_for("empty.jsonl", "\n{\"text\": \"\"}\n\n");
  EXPECT_NE(e.find("corpus is empty"), std::string::npos) << e;
  e = user_error([&] { jsonl_dataset({(dir.path() / "absent.jsonl").string()})->prepare(make_setup(tok, 4, 1)); });
  EXPECT_NE(e.find("no such file: '" + (dir.path() / "absent.jsonl").string()), std::string::npos) << e;
  const auto short_file = dir.write("short.jsonl", "{\"text\": \"tiny\"}\n");
  e = user_error([&] { jsonl_dataset({short_file.string()})->prepare(make_setup(tok, 64, 1)); });
  EXPECT_NE(e.find("seq_len 64 needs 65"), std::string::npos) << e;
  const auto ok = dir.write("ok.jsonl", jsonl_lines(20));
  e = user_error([&] { jsonl_dataset({ok.string()})->prepare(make_setup(tok, 4, 1, 1, 256)); });
  EXPECT_NE(e.find("token id 256"), std::string::npos) << "the end-of-text id is outside a 256-id model: " << e;
}

}  // namespace
}  // namespace loom::test
