// The chat dataset: rendering, loss masks, packing with segment ids, special tokens, bad records and
// deterministic batches; and the SDK's chat template functions it is built on.
#include <loom/chat_template.hpp>

#include "dataset_test_support.hpp"

namespace loom::test {
namespace {

// Bytes as ids, plus <|im_start|> (256), <|im_end|> (257) and an end of text (258) as special
// tokens, as a tokenizer.json with ChatML's added tokens would have them.
class SpecialTokenizer final : public Tokenizer {
 public:
  std::int64_t vocab_size() const override { return 259; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> out;
    for (std::size_t i = 0; i < text.size();) {
      if (text.substr(i, 12) == "<|im_start|>") {
        out.push_back(256);
        i += 12;
      } else if (text.substr(i, 10) == "<|im_end|>") {
        out.push_back(257);
        i += 10;
      } else {
        out.push_back(static_cast<unsigned char>(text[i++]));
      }
    }
    return out;
  }
  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string out;
    for (const auto id : ids)
      out += id == 256   ? "<|im_start|>"
             : id == 257 ? "<|im_end|>"
             : id == 258 ? "<|eot|>"
                         : std::string(1, static_cast<char>(id));
    return out;
  }
  std::optional<std::int32_t> end_of_text() const override { return 258; }
};

const std::string kTwo = R"({"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]})"
                         "\n"
                         R"({"prompt": "3+3?", "completion": "6"})"
                         "\n";

Value chat_options(const std::vector<std::string>& paths) {
  Value o = Value::map();
  o.set("paths", string_list(paths));
  o.set("validation_fraction", 0.0);
  o.set("shuffle", false);
  return o;
}

// The conversations of a row: per segment, the text of its inputs and of its trained targets.
struct Segment {
  std::string text, trained;
  std::int64_t positions = 0;
};
std::vector<Segment> segments_of(const Batch& b, std::int64_t row, const Tokenizer& tok) {
  std::vector<Segment> out;
  const auto at = static_cast<std::size_t>(row * b.seq_len);
  for (std::int64_t i = 0; i < b.seq_len; ++i) {
    const auto s = static_cast<std::size_t>(b.segment_ids[at + i]);
    if (out.size() <= s) out.resize(s + 1);
    const std::int32_t in = b.inputs[at + i], target = b.targets[at + i];
    out[s].text += tok.decode(std::span(&in, 1));
    if (target >= 0) out[s].trained += tok.decode(std::span(&target, 1));
    ++out[s].positions;
  }
  return out;
}

TEST(ChatTemplate, ChatmlRendersAndMasksAssistantTurns) {
  const std::vector<ChatMessage> m{{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}};
  const auto pieces = render_chat(ChatTemplate::chatml(), m);
  ASSERT_EQ(pieces.size(), 2u);  // what is not trained, then the answer
  EXPECT_EQ(pieces[0].text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_FALSE(pieces[0].trained);
  EXPECT_EQ(pieces[1].text, "Hello<|im_end|>\n");
  EXPECT_TRUE(pieces[1].trained);
  EXPECT_EQ(render_prompt(ChatTemplate::chatml(), std::span(m).first(2)),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplate, CustomStringsNeedContentOnce) {
  const auto t = ChatTemplate::from_strings("S: {content}\n", "Q: {content}\n", "A: {content}\n", "data");
  EXPECT_EQ(t.assistant().prefix, "A: ");
  EXPECT_EQ(t.assistant().suffix, "\n");
  EXPECT_NE(user_error([] {
              ChatTemplate::from_strings("{content}", "Q:", "A: {content}", "data");
            }).find("data.user: a chat template string holds {content} exactly once"),
            std::string::npos);
}

TEST(ChatTemplate, SpecialTokensOfTheTokenizer) {
  SpecialTokenizer special;
  TestTokenizer bytes(false, true);
  EXPECT_TRUE(missing_special_tokens(ChatTemplate::chatml(), special).empty());
  EXPECT_EQ(missing_special_tokens(ChatTemplate::chatml(), bytes),
            (std::vector<std::string>{"<|im_start|>", "<|im_end|>"}));
  const std::vector<ChatMessage> m{{"user", "a"}, {"assistant", "b"}};
  const ChatTokens t = tokenize_chat(special, render_chat(ChatTemplate::chatml(), m));
  // <|im_start|> u s e r \n a <|im_end|> \n <|im_start|> a s s i s t a n t \n | b <|im_end|> \n
  ASSERT_EQ(t.ids.size(), 23u);
  EXPECT_EQ(t.ids[0], 256);
  EXPECT_EQ(t.ids[21], 257);
  EXPECT_EQ(std::count(t.trained.begin(), t.trained.end(), 1), 3);  // b <|im_end|> \n
  EXPECT_EQ(t.trained[20], 1);
  EXPECT_EQ(t.trained[19], 0);
}

TEST(ChatTemplate, ParsesBothLayoutsAndRejectsTheRest) {
  auto m = parse_chat_record(R"({"prompt": "p", "completion": "c"})");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[1].content, "c");
  EXPECT_NE(user_error([] { parse_chat_record("{not json"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(user_error([] { parse_chat_record(R"({"text": "x"})"); }).find("neither \"messages\""), std::string::npos);
  EXPECT_NE(
      user_error([] { parse_chat_record(R"({"messages": [{"role": "bot", "content": "x"}]})"); }).find("role \"bot\""),
      std::string::npos);
  EXPECT_NE(user_error([] {
              parse_chat_record(R"({"messages": [{"role": "user", "content": "x"}]})");
            }).find("no assistant turn"),
            std::string::npos);
  EXPECT_NE(user_error([] { parse_chat_record(R"({"prompt": "x"})"); }).find("no string \"completion\""),
            std::string::npos);
}

TEST(ChatDataset, PacksConversationsWithSegmentsAndTrainsOnlyTheAnswers) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", kTwo);
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", chat_options({file.string()}));
  auto tok = std::make_shared<SpecialTokenizer>();
  ds->prepare(make_setup(tok, 64, 2));
  Batch b;
  ds->batch(Split::train, 0, b);
  ASSERT_EQ(b.inputs.size(), 128u);
  ASSERT_EQ(b.targets.size(), 128u);
  ASSERT_EQ(b.segment_ids.size(), 128u);
  // Both conversations (26 tokens: 25 positions each) fit in one row of 64, in file order (shuffle: false).
  const auto row = segments_of(b, 0, *tok);
  ASSERT_EQ(row.size(), 3u);  // two conversations and the padding
  EXPECT_EQ(row[0].text, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>");
  EXPECT_EQ(row[0].trained, "4<|im_end|>\n");
  EXPECT_EQ(row[1].text, "<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n6<|im_end|>");
  EXPECT_EQ(row[1].trained, "6<|im_end|>\n");
  EXPECT_EQ(row[2].trained, "");  // padding trains nothing
  EXPECT_EQ(row[0].positions + row[1].positions + row[2].positions, 64);
  // Targets are the next input inside a conversation, where they are trained.
  for (std::int64_t i = 0; i + 1 < 64; ++i)
    if (b.targets[i] >= 0 && b.segment_ids[i] == b.segment_ids[i + 1]) {
      EXPECT_EQ(b.targets[i], b.inputs[i + 1]) << i;
    }
  // The data repeats: the second row is the same single packed row again.
  EXPECT_TRUE(std::equal(b.inputs.begin(), b.inputs.begin() + 64, b.inputs.begin() + 64));
}

TEST(ChatDataset, WithoutPackingOneConversationPerRow) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", kTwo);
  Value o = chat_options({file.string()});
  o.set("pack", false);
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  auto tok = std::make_shared<SpecialTokenizer>();
  ds->prepare(make_setup(tok, 64, 2));
  Batch b;
  ds->batch(Split::train, 0, b);
  EXPECT_EQ(segments_of(b, 0, *tok)[0].trained, "4<|im_end|>\n");
  EXPECT_EQ(segments_of(b, 1, *tok)[0].trained, "6<|im_end|>\n");
  EXPECT_EQ(segments_of(b, 1, *tok).size(), 2u);
}

TEST(ChatDataset, CustomTemplateAndABytesTokenizer) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", kTwo);
  Value o = chat_options({file.string()});
  o.set("template", "custom");
  o.set("system_template", "{content}\n");
  o.set("user_template", "Q: {content}\n");
  o.set("assistant_template", "A: {content}\n");
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  auto tok = std::make_shared<TestTokenizer>(false, true);
  ds->prepare(make_setup(tok, 32, 1));
  Batch b;
  ds->batch(Split::train, 0, b);
  const auto row = segments_of(b, 0, *tok);
  EXPECT_EQ(row[0].text, "Q: 2+2?\nA: 4");
  EXPECT_EQ(row[0].trained, "4\n");
  EXPECT_EQ(row[1].text, "Q: 3+3?\nA: 6");
  EXPECT_EQ(row[1].trained, "6\n");
}

TEST(ChatDataset, RequireSpecialTokensFailsWithoutThem) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", kTwo);
  Value o = chat_options({file.string()});
  o.set("require_special_tokens", true);
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  const std::string e = user_error([&] { ds->prepare(make_setup(std::make_shared<TestTokenizer>(), 64, 1)); });
  EXPECT_NE(e.find("no single token for <|im_start|>, <|im_end|>"), std::string::npos) << e;
  auto ok = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  ok->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 64, 1));
}

TEST(ChatDataset, BadRecordsNameFileAndLineOrAreSkippedAndCounted) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", kTwo + "\n{\"prompt\": 3, \"completion\": \"x\"}\n" + kTwo);
  auto strict = make_dataset(LOOM_PLUGIN_DIR, "chat", chat_options({file.string()}));
  const std::string e = user_error([&] { strict->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 64, 1)); });
  EXPECT_NE(e.find(file.string() + ":4: has a \"completion\" but no string \"prompt\""), std::string::npos) << e;

  Value o = chat_options({file.string()});
  o.set("on_bad_record", "skip");
  o.set("pack", false);
  auto lenient = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  testing::internal::CaptureStderr();
  lenient->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 64, 4));
  const std::string note = testing::internal::GetCapturedStderr();
  EXPECT_NE(note.find("1 bad record skipped"), std::string::npos) << note;
  EXPECT_NE(note.find(file.string() + ":4"), std::string::npos) << note;
  EXPECT_EQ(lenient->num_tokens(Split::train), 4 * 26);  // the four good conversations, 26 tokens each
}

// A binary file given as chat data: the message quotes the bytes escaped, never raw.
TEST(ChatDataset, ABinaryFileIsQuotedEscaped) {
  TempDir dir;
  const auto png = dir.write("image.jsonl", std::string("\x89PNG\r\n\x1a\n\0\0\0\rIHDR\xff\xfe", 18));
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", chat_options({png.string()}));
  const std::string e = user_error([&] { ds->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 64, 1)); });
  EXPECT_NE(e.find("image.jsonl:1: not valid JSON"), std::string::npos) << e;
  EXPECT_NE(e.find("\\x89PNG"), std::string::npos) << e;
  EXPECT_TRUE(std::all_of(e.begin(), e.end(), [](char c) { return c >= 0x20 && c < 0x7f; })) << e;
}

TEST(ChatDataset, LongConversationsAreCutToTheContext) {
  TempDir dir;
  const auto file = dir.write("chat.jsonl", R"({"prompt": "hi", "completion": "a long answer"})"
                                            "\n"
                                            R"({"prompt": "a very long question indeed", "completion": "x"})"
                                            "\n");
  Value o = chat_options({file.string()});
  o.set("template", "custom");
  o.set("system_template", "{content}");
  o.set("user_template", "{content}|");
  o.set("assistant_template", "{content}.");
  o.set("on_bad_record", "skip");
  auto ds = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  auto tok = std::make_shared<TestTokenizer>();
  testing::internal::CaptureStderr();
  ds->prepare(make_setup(tok, 8, 1));
  const std::string note = testing::internal::GetCapturedStderr();
  // The first is cut to 9 tokens ("hi|a long"), the second has no answer within them.
  EXPECT_NE(note.find("1 bad record skipped"), std::string::npos) << note;
  EXPECT_NE(note.find("no assistant token within the first 9 tokens"), std::string::npos) << note;
  Batch b;
  ds->batch(Split::train, 0, b);
  const auto row = segments_of(b, 0, *tok);
  EXPECT_EQ(row[0].text, "hi|a lon");
  EXPECT_EQ(row[0].trained, "a long");
}

TEST(ChatDataset, BatchesAreAPureFunctionOfSplitAndIndex) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 60; ++i)
    lines += R"({"prompt": "q)" + std::to_string(i) + R"(", "completion": "a)" + std::to_string(i * 7) + "\"}\n";
  const auto file = dir.write("chat.jsonl", lines);
  Value o = Value::map();
  o.set("paths", string_list({file.string()}));
  auto a = make_dataset(LOOM_PLUGIN_DIR, "chat", o), b = make_dataset(LOOM_PLUGIN_DIR, "chat", o);
  a->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 48, 3, 7));
  b->prepare(make_setup(std::make_shared<SpecialTokenizer>(), 48, 3, 7));
  Batch x, y;
  std::set<std::vector<std::int32_t>> seen;
  for (std::int64_t i : {5, 0, 11, 5}) {
    a->batch(Split::train, i, x);
    b->batch(Split::train, i, y);
    EXPECT_EQ(x.inputs, y.inputs);
    EXPECT_EQ(x.targets, y.targets);
    EXPECT_EQ(x.segment_ids, y.segment_ids);
    seen.insert(x.inputs);
  }
  EXPECT_EQ(seen.size(), 3u);  // different indices, different batches
  // The last 10% (6 conversations) are the validation split, in file order.
  EXPECT_GT(a->num_tokens(Split::validation), 0);
  a->batch(Split::validation, 0, x);
  const auto first = segments_of(x, 0, SpecialTokenizer());
  EXPECT_EQ(first[0].trained, "a378<|im_end|>\n");  // conversation 54
}

}  // namespace
}  // namespace loom::test
