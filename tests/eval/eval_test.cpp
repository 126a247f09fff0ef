// `loom eval` (docs/evaluation.md): each task family's requests are the strings lm-evaluation-
// harness builds, requests are encoded and windowed as its HFLM does, the metrics and standard
// errors are its formulas, and the scorer's log-likelihoods (batched, deduplicated, through a
// shared KV cache or not) are the model's, as TokenStream scores them one token at a time.
#include "loom/run/eval.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "../../core/run/src/eval/python_random.hpp"
#include "../core/test_support.hpp"
#include "loom/core/json_value.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/hf_interop.hpp"
#include "loom/run/hf_interop.hpp"
#include "loom/run/report.hpp"
#include "loom/run/run_config.hpp"

namespace fs = std::filesystem;

namespace loom::eval {
namespace {

Task task_from(const test::TempDir& dir, const std::string& family, const std::string& name, const std::string& lines) {
  const fs::path file = dir.write(name, lines);
  return load_task(parse_task_specs({family + ":" + file.string()}, dir.path()).front());
}

TEST(EvalTasks, HellaswagIsPreprocessedAsTheHarnessDoes) {
  test::TempDir dir;
  const Task t =
      task_from(dir, "hellaswag", "h.jsonl",
                R"({"activity_label": "Home and Garden", "ctx_a": "[header] How to plant [title] Dig a hole.",)"
                R"( "ctx_b": "then YOU", "endings": [" [step] Water it.  Wait. ", "Sing [x] loud"], "label": "1"})"
                "\n");
  ASSERT_EQ(t.docs.size(), 1u);
  const TaskDoc& d = t.docs[0];
  // ctx_a + " " + ctx_b.capitalize(), then strip, " [title]" -> ". ", "[...]" dropped, "  " -> " "
  // (the strings the harness's hellaswag/utils.py gives for this document).
  EXPECT_EQ(d.requests[0].context, "Home and Garden: How to plant. Dig a hole. Then you");
  EXPECT_EQ(d.requests[0].continuation, "  Water it. Wait.");
  EXPECT_EQ(d.requests[1].continuation, " Sing loud");
  EXPECT_EQ(d.choice_lengths, (std::vector<double>{16, 9}));
  EXPECT_EQ(d.gold, 1);

  // Python's capitalize() and strip() are Unicode's: full case mappings, every whitespace of
  // str.isspace() (the harness's strings for this document, from CPython 3.11).
  const Task u =
      task_from(dir, "hellaswag", "u.jsonl",
                "{\"activity_label\": \"Caf\u00e9\u2003\", \"ctx_a\": \"\u00a0Un homme\", \"ctx_b\": "
                "\"\u00e9LAN du \u00dcBER \u00df\", \"endings\": [\"\u3000rides.\u2028\", \"\u00dfoo\u00a0\"], "
                "\"label\": \"0\"}\n"
                "{\"activity_label\": \"a\", \"ctx_a\": \"b\", \"ctx_b\": \"\u00dfig \u0130T\", \"endings\": [\"x\"], "
                "\"label\": 0}\n");
  EXPECT_EQ(u.docs[0].requests[0].context, "Caf\u00e9\u2003: \u00a0Un homme \u00c9lan du \u00fcber \u00df");
  EXPECT_EQ(u.docs[0].requests[0].continuation, " rides.");
  EXPECT_EQ(u.docs[0].requests[1].continuation, " \u00dfoo");
  EXPECT_EQ(u.docs[0].choice_lengths, (std::vector<double>{6, 3}));
  EXPECT_EQ(u.docs[1].requests[0].context, "a: b Ssig i\u0307t");
}

TEST(EvalTasks, ArcPiqaMmluLambadaAndGenericPrompts) {
  test::TempDir dir;
  const Task arc =
      task_from(dir, "arc_easy", "a.jsonl",
                R"({"question": "Why?", "choices": {"text": ["x", "yé"], "label": ["1", "2"]}, "answerKey": "2"})"
                "\n");
  EXPECT_EQ(arc.docs[0].requests[1].context, "Question: Why?\nAnswer:");
  EXPECT_EQ(arc.docs[0].requests[1].continuation, " yé");
  EXPECT_EQ(arc.docs[0].choice_lengths[1], 2);  // characters, not bytes
  EXPECT_EQ(arc.docs[0].gold, 1);
  const Task piqa = task_from(dir, "piqa", "p.jsonl",
                              R"({"goal": "Open a jar", "sol1": "twist", "sol2": "pull", "label": 1})"
                              "\n");
  EXPECT_EQ(piqa.docs[0].requests[0].context, "Question: Open a jar\nAnswer:");
  EXPECT_EQ(piqa.docs[0].requests[1].continuation, " pull");
  const Task mmlu = task_from(
      dir, "mmlu", "m.jsonl",
      R"({"question": " What? ", "subject": "high_school_physics", "choices": ["a", "b", "c", "d"], "answer": 2})"
      "\n");
  EXPECT_EQ(mmlu.docs[0].requests[0].context,
            "The following are multiple choice questions (with answers) about high school physics.\n\n"
            "What?\nA. a\nB. b\nC. c\nD. d\nAnswer:");
  EXPECT_EQ(mmlu.docs[0].requests[3].continuation, " D");
  EXPECT_EQ(mmlu.docs[0].gold, 2);
  const Task lambada = task_from(dir, "lambada", "l.jsonl",
                                 R"({"text": "he said  hello there"})"
                                 "\n");
  EXPECT_EQ(lambada.docs[0].requests[0].context, "he said  hello");
  EXPECT_EQ(lambada.docs[0].requests[0].continuation, " there");
  const Task generic = task_from(dir, "multiple_choice", "g.jsonl",
                                 R"({"context": "1+1=", "choices": ["2", "3"], "label": 0})"
                                 "\n");
  EXPECT_EQ(generic.spec.name, "g");
  EXPECT_EQ(generic.docs[0].requests[0].continuation, " 2");
}

TEST(EvalTasks, WinograndeScoresTheSentenceAfterTheBlank) {
  test::TempDir dir;
  const Task t = task_from(
      dir, "winogrande", "w.jsonl",
      R"({"sentence": "The cup fell because the _ was  slippery. ", "option1": "cup", "option2": "table", "answer": "2"})"
      "\n");
  const TaskDoc& d = t.docs[0];
  EXPECT_EQ(d.requests[0].context, "The cup fell because the cup");
  EXPECT_EQ(d.requests[1].context, "The cup fell because the table");
  EXPECT_EQ(d.requests[0].continuation, " was  slippery.");
  EXPECT_EQ(d.requests[1].continuation, d.requests[0].continuation);
  EXPECT_EQ(d.gold, 1);
}

TEST(EvalTasks, TaskNamesFilesAndErrors) {
  test::TempDir dir;
  dir.write("data/hellaswag.jsonl", "{}\n");
  dir.write("data/piqa_validation.jsonl", "{}\n");
  dir.write("data/corpus.txt", "text");
  dir.write("data/mine.jsonl", "{}\n");
  const auto specs = parse_task_specs(
      {"hellaswag",
       (dir.path() / "data/piqa_validation.jsonl").string() + "," + (dir.path() / "data/corpus.txt").string(),
       (dir.path() / "data/mine.jsonl").string()},
      dir.path() / "data");
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs[0].family, TaskFamily::hellaswag);
  EXPECT_EQ(specs[1].name, "piqa");
  EXPECT_EQ(specs[2].family, TaskFamily::perplexity);
  EXPECT_EQ(specs[2].name, "corpus");
  EXPECT_EQ(specs[3].family, TaskFamily::multiple_choice);
  EXPECT_EQ(specs[3].name, "mine");
  EXPECT_THROW(parse_task_specs({"helaswag"}, dir.path()), UserError);
  EXPECT_THROW(parse_task_specs({"piqa"}, dir.path()), UserError);  // no data/piqa.jsonl in task dir
  EXPECT_THROW(parse_task_specs({"hellaswag,hellaswag"}, dir.path() / "data"), UserError);

  auto message = [&](const std::string& family, const std::string& text) {
    try {
      task_from(dir, family, "bad.jsonl", text);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("piqa", "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 2}\n")
                .find("bad.jsonl:1: \"label\" is 2, out of range: it must be 0 to 1"),
            std::string::npos);
  EXPECT_NE(message("arc_easy", "\n{\"question\": 1, \"choices\": {\"text\": [\"a\"], \"label\": [\"A\"]}}\n")
                .find("bad.jsonl:2: \"question\" is not a string"),
            std::string::npos);
  EXPECT_NE(message("hellaswag", "not json\n").find("bad.jsonl:1: not a JSON object"), std::string::npos);
  EXPECT_NE(message("winogrande", R"({"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"})"
                                  "\n")
                .find("has no \"_\""),
            std::string::npos);

  // Every integer is range-checked, whatever its size: none wraps or truncates into range.
  const std::string wino = R"({"sentence": "a _ b", "option1": "x", "option2": "y", "answer": )";
  EXPECT_NE(
      message("winogrande", wino + "4294967297}\n")
          .find("bad.jsonl:1: \"answer\" is 4294967297, out of range: it must be 1 to 2 (1: option1, 2: option2)"),
      std::string::npos);
  EXPECT_NE(message("winogrande", wino + "\"3\"}\n").find("bad.jsonl:1: \"answer\" is \"3\": it must be \"1\""),
            std::string::npos);
  EXPECT_NE(message("winogrande", wino + "2.0}\n").find("\"answer\" is 2.0, not an integer (1 to 2"),
            std::string::npos);
  const std::string generic = R"({"context": "c", "choices": ["a", "b", "c"], "label": )";
  for (const std::string label : {"18446744073709551615", "-1", "9223372036854775807", "\"99999999999999999999\"", "3"})
    EXPECT_NE(message("multiple_choice", "\n" + generic + label + "}\n")
                  .find("bad.jsonl:2: \"label\" is " + label +
                        ", out of range: it must be 0 to 2 (the right one of the 3 choices, counted from 0)"),
              std::string::npos)
        << label;
  EXPECT_NE(message("mmlu", R"({"question": "q", "choices": ["a", "b", "c", "d"], "answer": 4294967296})"
                            "\n")
                .find("\"answer\" is 4294967296, out of range: it must be 0 to 3"),
            std::string::npos);
  EXPECT_NE(
      message("hellaswag", R"({"activity_label": "a", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": "2"})"
                           "\n")
          .find("\"label\" is \"2\", out of range: it must be 0 to 1"),
      std::string::npos);

  // A directory, invalid UTF-8 and a perplexity task without text are named as what they are.
  fs::create_directories(dir.path() / "tasks.jsonl");
  try {
    parse_task_specs({(dir.path() / "tasks.jsonl").string()}, dir.path());
    ADD_FAILURE() << "a directory taken as a task file";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
  EXPECT_NE(message("piqa", "{\"goal\": \"g\xff\"}\n").find("bad.jsonl:1: not UTF-8 text: byte 12 of the line"),
            std::string::npos);
  auto perplexity_message = [&](const std::string& name, const std::string& text) {
    try {
      load_task(parse_task_specs({"perplexity:" + dir.write(name, text).string()}, dir.path()).front());
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(perplexity_message("empty.txt", "").find("empty.txt' is empty: a perplexity task needs text"),
            std::string::npos);
  EXPECT_NE(
      perplexity_message("blank.jsonl", "{\"text\": \"\"}\n\n{\"text\": \"\"}\n").find("blank.jsonl' holds no text"),
      std::string::npos);
  EXPECT_NE(perplexity_message("latin1.txt", "ok\ncaf\xe9\n").find("latin1.txt' is not UTF-8 text: byte 7 (line 2)"),
            std::string::npos);
}

TEST(EvalTasks, LimitKeepsTheFirstDocuments) {
  test::TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i) lines += R"({"text": "a b )" + std::to_string(i) + "\"}\n";
  const fs::path file = dir.write("lambada.jsonl", lines);
  const Task t = load_task(parse_task_specs({file.string()}, dir.path()).front(), 3);
  ASSERT_EQ(t.docs.size(), 3u);
  EXPECT_EQ(t.docs[2].requests[0].continuation, " 2");
}

// Words as ids (a space joins with the word after it, as in GPT-2's BPE): "a b" -> ["a", " b"].
class WordTokenizer final : public Tokenizer {
 public:
  std::int64_t vocab_size() const override { return 64; }
  std::vector<std::int32_t> encode(std::string_view text) const override {
    std::vector<std::int32_t> ids;
    std::size_t i = 0;
    while (i < text.size()) {
      std::size_t j = i + 1;
      while (j < text.size() && text[j] != ' ') ++j;
      std::uint32_t h = 2166136261u;
      for (std::size_t k = i; k < j; ++k) h = (h ^ static_cast<unsigned char>(text[k])) * 16777619u;
      ids.push_back(static_cast<std::int32_t>(h % 63));
      i = j;
    }
    return ids;
  }
  std::string decode(std::span<const std::int32_t>) const override { return ""; }
  std::optional<std::int32_t> end_of_text() const override { return 63; }
};

// Few-shot prompts (--num-fewshot): the harness's examples, drawn as its samplers draw them. The
// indices are CPython 3.11's random.Random(1234).sample(range(n), k), one draw per document.
TEST(EvalFewShot, ExamplesAreDrawnAsTheHarnessDrawsThem) {
  PythonRandom small(1234);
  EXPECT_EQ(small.sample(10, 3), (std::vector<std::size_t>{7, 1, 0}));  // a pool: n <= setsize
  EXPECT_EQ(small.sample(10, 3), (std::vector<std::size_t>{1, 0, 9}));
  PythonRandom big(1234);
  EXPECT_EQ(big.sample(100, 8), (std::vector<std::size_t>{99, 56, 14, 0, 11, 74, 4, 85}));  // k > 5: a larger set
  EXPECT_EQ(big.sample(100, 8), (std::vector<std::size_t>{88, 10, 12, 98, 45, 30, 2, 3}));

  test::TempDir dir;
  std::string generic, piqa, mmlu;
  for (int i = 0; i < 30; ++i) {
    const std::string n = std::to_string(i);
    generic += R"({"context": "q)" + n + R"(", "choices": ["a)" + n + R"(", "b)" + n + R"("], "label": 0})" + "\n";
    piqa += R"({"goal": "g)" + n + R"(", "sol1": "s)" + n + R"(", "sol2": "t)" + n + R"(", "label": 1})" + "\n";
    mmlu +=
        R"({"question": "m)" + n + R"(", "subject": "anatomy", "choices": ["w", "x", "y", "z"], "answer": 2})" + "\n";
  }
  auto load = [&](const std::string& family, const std::string& lines, std::int64_t k) {
    const fs::path file = dir.write(family + ".jsonl", lines);
    return load_task(parse_task_specs({family + ":" + file.string()}, dir.path()).front(), 3, FewShotOptions{k});
  };
  // Generic (and arc, lambada): K draws, the document itself left out (document 2 drew [2, 29]).
  const Task g = load("multiple_choice", generic, 2);
  ASSERT_EQ(g.docs.size(), 3u);
  EXPECT_EQ(g.docs[0].requests[1].context, "q24 a24\n\nq14 a14\n\nq0");
  EXPECT_EQ(g.docs[0].requests[1].continuation, " b0");
  EXPECT_EQ(g.docs[1].requests[0].context, "q3 a3\n\nq0 a0\n\nq1");
  EXPECT_EQ(g.docs[2].requests[0].context, "q29 a29\n\nq2");
  // piqa (and hellaswag, winogrande): K + 1 draws, the first K that are not the document.
  const Task p = load("piqa", piqa, 2);
  EXPECT_EQ(p.docs[0].requests[0].context,
            "Question: g24\nAnswer: t24\n\nQuestion: g14\nAnswer: t14\n\nQuestion: g0\nAnswer:");
  EXPECT_EQ(p.docs[1].requests[0].context,
            "Question: g0\nAnswer: t0\n\nQuestion: g2\nAnswer: t2\n\nQuestion: g1\nAnswer:");
  EXPECT_EQ(p.docs[2].requests[1].context,
            "Question: g25\nAnswer: t25\n\nQuestion: g18\nAnswer: t18\n\nQuestion: g2\nAnswer:");
  // mmlu: the first K (less the document itself), after the description.
  const Task m = load("mmlu", mmlu, 2);
  const std::string description = "The following are multiple choice questions (with answers) about anatomy.\n\n";
  const std::string choices = "\nA. w\nB. x\nC. y\nD. z\nAnswer:";
  EXPECT_EQ(m.docs[0].requests[0].context, description + "m1" + choices + " C\n\nm0" + choices);
  EXPECT_EQ(m.docs[2].requests[3].context, description + "m0" + choices + " C\n\nm1" + choices + " C\n\nm2" + choices);
  // Zero-shot is unchanged, description included; --limit keeps the first documents' examples.
  EXPECT_EQ(load("mmlu", mmlu, 0).docs[1].requests[0].context, description + "m1" + choices);
  EXPECT_EQ(
      load_task(
          parse_task_specs({"multiple_choice:" + (dir.path() / "multiple_choice.jsonl").string()}, dir.path()).front(),
          0, FewShotOptions{2})
          .docs[1]
          .requests[0]
          .context,
      g.docs[1].requests[0].context);
  // Refusals: more draws than documents, and a perplexity task.
  EXPECT_THROW(load("piqa", piqa, 30), UserError);
  const fs::path text = dir.write("text.txt", "one two three");
  EXPECT_THROW(load_task(parse_task_specs({text.string()}, dir.path()).front(), 0, FewShotOptions{1}), UserError);
}

// A winogrande example whose blank ends its sentence has an empty target: lm-eval 0.4.5's sampler
// writes its text alone, without the target delimiter and the few-shot delimiter (`if doc_target
// != ""`). The contexts are the harness's (its sampler, replayed in CPython 3.11) for these files.
TEST(EvalFewShot, AWinograndeExampleWithoutTargetEndsAtItsOption) {
  test::TempDir dir;
  const fs::path file =
      dir.write("winogrande.jsonl",
                R"({"sentence": "The bag fit into _", "option1": "the car", "option2": "the box", "answer": "1"}
{"sentence": "Tom gave _ a book.", "option1": "Ann", "option2": "Bob", "answer": "2"}
{"sentence": "She ate _", "option1": "it", "option2": "them", "answer": "2"}
{"sentence": "We saw _ there.", "option1": "him", "option2": "her", "answer": "1"}
)");
  auto load = [&](std::int64_t k) {
    return load_task(parse_task_specs({file.string()}, dir.path()).front(), 0, FewShotOptions{k});
  };
  const Task one = load(1);
  EXPECT_EQ(one.docs[0].requests[1].context, "We saw him there.\n\nThe bag fit into the box");
  EXPECT_EQ(one.docs[0].requests[0].continuation, " ");
  EXPECT_EQ(one.docs[1].requests[0].context, "The bag fit into the carTom gave Ann");
  EXPECT_EQ(one.docs[2].requests[1].context, "The bag fit into the carShe ate them");
  EXPECT_EQ(one.docs[3].requests[0].context, "The bag fit into the carWe saw him");
  const Task two = load(2);
  EXPECT_EQ(two.docs[0].requests[0].context, "We saw him there.\n\nShe ate themThe bag fit into the car");
  EXPECT_EQ(two.docs[1].requests[1].context, "The bag fit into the carShe ate themTom gave Bob");
  EXPECT_EQ(two.docs[2].requests[0].context, "The bag fit into the carWe saw him there.\n\nShe ate it");
  EXPECT_EQ(two.docs[3].requests[1].context, "Tom gave Bob a book.\n\nThe bag fit into the carWe saw her");
}

TEST(EvalRequests, EncodedAsTheHarnessEncodesPairs) {
  const WordTokenizer tok;
  // Trailing spaces of the context move to the continuation; the continuation is what the whole
  // encodes to past the context's tokens.
  const TokenRequest r = encode_request(tok, {"the cat ", "sat"}, 63);
  EXPECT_EQ(r.context, tok.encode("the cat"));
  EXPECT_EQ(r.continuation, tok.encode(" sat"));
  const TokenRequest empty = encode_request(tok, {"", " sat down"}, 63);
  EXPECT_EQ(empty.context, std::vector<std::int32_t>{63});
  EXPECT_EQ(empty.continuation, tok.encode(" sat down"));
  // Python's rstrip() removes Unicode's whitespace: it moves to the continuation too.
  for (const std::string space : {"\u00a0", "\u3000", "\u2003", "\u0085", "\u2028"}) {
    const TokenRequest u = encode_request(tok, {"the cat" + space, "sat"}, 63);
    EXPECT_EQ(u.context, tok.encode("the cat")) << space;
    const std::vector<std::int32_t> whole = tok.encode("the cat" + space + "sat");
    EXPECT_EQ(u.continuation, std::vector<std::int32_t>(whole.begin() + 2, whole.end())) << space;
  }
}

// Each document checked against the model before any scoring, named by file and line: a
// continuation longer than the context, one that is empty or encodes to nothing on its own. One
// whose tokens merged into the context's last token is scored as the harness scores it (0, greedy).
TEST(EvalRequests, DocumentsTheModelCannotScoreAreNamedByFileAndLine) {
  test::TempDir dir;
  const WordTokenizer tok;
  auto message = [&](const std::string& lines, std::int64_t max_len) {
    const Task task = task_from(dir, "multiple_choice", "mc.jsonl", lines);
    try {
      encode_task(task, tok, 63, max_len);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string ok = R"({"context": "a b", "choices": ["c", "d"], "label": 0})"
                         "\n";
  EXPECT_EQ(message(ok + ok, 4), "no error");
  EXPECT_NE(message(ok + R"({"context": "a", "choices": ["c", "d e f g h"], "label": 0})"
                         "\n",
                    4)
                .find("mc.jsonl:2: choice 1's continuation is 5 tokens, longer than the model's context of 4 tokens"),
            std::string::npos);
  EXPECT_NE(message(ok + "\n" +
                        R"({"context": "a", "choices": ["c", ""], "label": 0, "target_delimiter": ""})"
                        "\n",
                    4)
                .find("mc.jsonl:3: choice 1's continuation \"\" is empty: nothing to score"),
            std::string::npos);
  // "pre" + "fix" encodes to the one word "prefix": the continuation has no token of its own.
  const Task merged =
      task_from(dir, "multiple_choice", "merged.jsonl",
                R"({"context": "the word is pre", "choices": ["fix", " text"], "label": 0, "target_delimiter": ""})"
                "\n");
  const EncodedTask encoded = encode_task(merged, tok, 63, 16);
  ASSERT_EQ(encoded.requests.size(), 2u);
  EXPECT_TRUE(encoded.requests[0].continuation.empty());
  EXPECT_EQ(encoded.requests[1].continuation, tok.encode(" text"));
}

TEST(EvalRequests, RollingWindowsPredictEveryTokenOnce) {
  std::vector<std::int32_t> tokens(23);
  for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::int32_t>(i);
  const auto windows = rolling_windows(tokens, 99, 8);
  std::vector<std::int32_t> predicted;
  for (const auto& w : windows) {
    // The input (context + continuation without its last token) fills the context when it can.
    EXPECT_LE(w.context.size() + w.continuation.size() - 1, 8u);
    predicted.insert(predicted.end(), w.continuation.begin(), w.continuation.end());
  }
  EXPECT_EQ(predicted, tokens);
  ASSERT_EQ(windows.size(), 3u);
  EXPECT_EQ(windows[0].context, std::vector<std::int32_t>{99});
  EXPECT_EQ(windows[1].context.size() + windows[1].continuation.size(), 9u);  // a full context
  EXPECT_EQ(windows[2].continuation, (std::vector<std::int32_t>{16, 17, 18, 19, 20, 21, 22}));
  EXPECT_EQ(windows[2].context, (std::vector<std::int32_t>{14, 15}));
  EXPECT_TRUE(rolling_windows({}, 99, 8).empty());
}

TEST(EvalMetrics, AccuracyNormalisationAndStandardErrors) {
  Task task;
  task.spec.family = TaskFamily::hellaswag;
  TaskDoc doc;
  doc.choice_lengths = {1, 10};
  task.docs = {doc, doc, doc};
  // acc picks the highest log-likelihood (the first of equal ones); acc_norm divides by length.
  std::vector<DocLog> logs(3);
  for (int i = 0; i < 3; ++i) logs[static_cast<std::size_t>(i)].index = i;
  logs[0].results = {{-2.0, false}, {-5.0, false}};
  logs[0].gold = 0;
  logs[0].pred = 0;
  logs[0].pred_norm = 1;
  logs[1] = logs[0];
  logs[1].index = 1;
  logs[1].gold = 1;
  logs[2] = logs[0];
  logs[2].index = 2;
  const auto metrics = task_metrics(task, logs);
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[0].name, "acc");
  EXPECT_DOUBLE_EQ(metrics[0].value, 2.0 / 3);
  // The sample standard deviation (n - 1) over sqrt(n).
  EXPECT_NEAR(*metrics[0].stderr_value, std::sqrt((2 * (1.0 / 9) + 4.0 / 9) / 2) / std::sqrt(3.0), 1e-12);
  EXPECT_EQ(metrics[1].name, "acc_norm");
  EXPECT_DOUBLE_EQ(metrics[1].value, 1.0 / 3);
  EXPECT_FALSE(mean_stderr(std::vector<double>{1.0}).has_value());

  // LAMBADA's perplexity: its standard error is the harness's bootstrap (100000 resamples, drawn
  // by Python's random.Random(i) per chunk of 1000): lm_eval.api.metrics.bootstrap_stderr(perplexity,
  // xs, 100000) gives 3.8126131948643756 for these six log-likelihoods.
  Task lambada;
  lambada.spec.family = TaskFamily::lambada;
  lambada.docs.resize(6);
  std::vector<DocLog> six(6);
  const double lls[] = {-1.0, -2.5, -0.3, -4.0, -2.0, -0.7};
  for (std::size_t i = 0; i < 6; ++i) six[i].results = {{lls[i], i % 2 == 0}};
  const auto l = task_metrics(lambada, six);
  EXPECT_EQ(l[0].name, "perplexity");
  EXPECT_DOUBLE_EQ(l[0].value, std::exp(10.5 / 6));
  EXPECT_NEAR(*l[0].stderr_value, 3.8126131948643756, 1e-12);
  EXPECT_EQ(l[1].name, "acc");
  EXPECT_DOUBLE_EQ(l[1].value, 0.5);

  // mmlu: the overall acc over every question, and per category and subject as the harness
  // reports them. The figures are lm_eval 0.4.5's own (api.metrics: mean, mean_stderr,
  // aggregate_subtask_metrics weighted by size, pooled_sample_stderr) for these answers.
  Task mmlu;
  mmlu.spec.family = TaskFamily::mmlu;
  mmlu.spec.name = "mmlu";
  const std::vector<std::pair<std::string, std::vector<int>>> answers = {
      {"astronomy", {1, 1, 0, 0}}, {"my_subject", {1, 0}}, {"anatomy", {1, 0, 1}}, {"formal_logic", {0, 1}}};
  std::vector<DocLog> mmlu_logs;
  for (const auto& [subject, right] : answers)
    for (int r : right) {
      TaskDoc q;
      q.group = subject;
      q.choice_lengths = {1, 1, 1, 1};
      mmlu.docs.push_back(q);
      DocLog log;
      log.index = static_cast<std::int64_t>(mmlu_logs.size());
      log.gold = 2;
      log.pred = r ? 2 : 0;
      mmlu_logs.push_back(log);
    }
  const auto overall = task_metrics(mmlu, mmlu_logs);
  ASSERT_EQ(overall.size(), 1u);
  EXPECT_NEAR(overall[0].value, 0.5454545454545454, 1e-15);
  EXPECT_NEAR(*overall[0].stderr_value, 0.18609684207969418, 1e-15);
  const auto subtasks = mmlu_subtasks(mmlu, mmlu_logs);
  std::vector<std::string> names, groups;
  for (const auto& sub : subtasks) {
    names.push_back(sub.name);
    groups.push_back(sub.group);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"mmlu_humanities", "mmlu_formal_logic", "mmlu_stem", "mmlu_anatomy",
                                             "mmlu_astronomy", "mmlu_my_subject"}));
  EXPECT_EQ(groups, (std::vector<std::string>{"mmlu", "mmlu_humanities", "mmlu", "mmlu_stem", "mmlu_stem", "mmlu"}));
  const std::vector<std::array<double, 3>> expected = {{2, 0.5, 0.5},
                                                       {2, 0.5, 0.5},
                                                       {7, 0.5714285714285714, 0.2182178902359924},
                                                       {3, 0.6666666666666666, 0.33333333333333337},
                                                       {4, 0.5, 0.28867513459481287},
                                                       {2, 0.5, 0.5}};
  ASSERT_EQ(subtasks.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(subtasks[i].docs, static_cast<std::int64_t>(expected[i][0]));
    ASSERT_EQ(subtasks[i].metrics.size(), 1u);
    EXPECT_EQ(subtasks[i].metrics[0].name, "acc");
    EXPECT_NEAR(subtasks[i].metrics[0].value, expected[i][1], 1e-15);
    EXPECT_NEAR(*subtasks[i].metrics[0].stderr_value, expected[i][2], 1e-15);
  }
  // A subject of one question has no standard error, nor has a category holding it ("N/A").
  mmlu.docs.push_back(mmlu.docs.front());
  mmlu.docs.back().group = "virology";
  mmlu_logs.push_back(mmlu_logs.front());
  mmlu_logs.back().index = static_cast<std::int64_t>(mmlu.docs.size() - 1);
  const auto with_one = mmlu_subtasks(mmlu, mmlu_logs);
  ASSERT_EQ(with_one[2].name, "mmlu_other");
  EXPECT_FALSE(with_one[2].metrics[0].stderr_value.has_value());
  EXPECT_FALSE(with_one[3].metrics[0].stderr_value.has_value());
  EXPECT_FALSE(task_metrics(mmlu, mmlu_logs)[0].stderr_value.has_value());

  Task text;
  text.spec.family = TaskFamily::perplexity;
  TaskDoc d;
  d.text = "one two\n three";  // 3 words, 14 bytes
  text.docs = {d};
  std::vector<DocLog> one(1);
  one[0].results = {{-6.0, false}};
  one[0].tokens = 4;
  const auto p = task_metrics(text, one);
  EXPECT_DOUBLE_EQ(p[0].value, std::exp(6.0 / 3));
  EXPECT_DOUBLE_EQ(p[1].value, std::exp(6.0 / 14));
  EXPECT_DOUBLE_EQ(p[2].value, 6.0 / 14 / std::log(2.0));
  EXPECT_DOUBLE_EQ(p[3].value, std::exp(6.0 / 4));
}

// A random gpt2 or llama of the build's plugins.
struct Lm {
  std::unique_ptr<Runtime> runtime;
  Handle<Backend> backend;
  Handle<Model> model;
};

Lm make_lm(const test::TempDir& dir, const std::string& model_yaml) {
  const auto file = dir.write("model.yaml", "model: " + model_yaml + "\nbackend: {type: cpu, matmul_precision: f32}\n");
  RuntimeOptions options;
  options.config = file;
  Lm lm;
  lm.runtime = std::make_unique<Runtime>(options);
  const Value config = resolved_run_config(*lm.runtime);
  lm.backend = lm.runtime->registry().create<Backend>(ComponentRef{"backend", "", *config.find("backend"), "backend"});
  lm.model = lm.runtime->registry().create<Model>(ComponentRef{"model", "", *config.find("model"), "model"});
  lm.model->build(ModelSetup{64});
  lm.model->initialize(3);
  return lm;
}

// ---- A Hugging Face directory described by its own files ----

// JSON <-> Value through the interop layer's own conversion (unordered JSON, as the test builds it).
nlohmann::json to_json(const Value& v) {
  return nlohmann::json::parse(interop::to_json(v).dump());
}

Value to_value_for_test(const nlohmann::json& j) {
  return interop::to_value(nlohmann::ordered_json::parse(j.dump()));
}

// A directory with `config_json` and (empty) GPT-2 tokenizer files: describe_hf_model_dir's model
// section, built, is the model config.json describes, by the plugin's own check.
Handle<Model> described_model(const test::TempDir& dir, Runtime& runtime, const std::string& name,
                              const nlohmann::json& config_json) {
  fs::create_directories(dir.path() / name);
  dir.write(name + "/config.json", config_json.dump(2));
  dir.write(name + "/vocab.json", "{}");
  dir.write(name + "/merges.txt", "#version: 0.2\n");
  const HfDirectoryConfig described = describe_hf_model_dir(runtime.registry(), dir.path() / name);
  EXPECT_EQ(described.tokenizer.find("type")->as_string(), "gpt2-bpe");
  EXPECT_EQ(described.tokenizer.find("encoder_json")->as_string(), (dir.path() / name / "vocab.json").string());
  auto model = runtime.registry().create<Model>(ComponentRef{"model", "", described.model, "model"});
  model->build(ModelSetup{64});
  const auto mismatches = dynamic_cast<const HfModel&>(*model).hf_config_mismatches(to_value_for_test(config_json));
  std::string all;
  for (const auto& m : mismatches) all += m + "\n";
  EXPECT_TRUE(mismatches.empty()) << name << ": " << all;
  return model;
}

// Every architecture loom exports reads back, without a config, as the same model: the exported
// config.json of a loom model describes a model whose own config.json is the same.
// The token before an empty context of a Hugging Face directory is HFLM's prefix_token_id: the
// tokenizer's BOS, or its EOS where it has none, as transformers 4.46 reads them; config.json's
// bos_token_id plays no part.
TEST(EvalHfDirectory, AnEmptyContextIsTheTokenizersBosOrElseItsEos) {
  test::TempDir dir;
  const WordTokenizer tok;
  // loom's model plugins, which declare the tokenizer classes (Registrar::add_hf_tokenizer_class).
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}");
  const std::string vocab = R"({"model": {"type": "BPE", "vocab": {"<s>": 1, "</s>": 2, "a": 3}},
                               "added_tokens": [{"id": 40, "content": "<|endoftext|>"}, {"id": 41, "content": "<|im_end|>"}]})";
  auto prefix = [&](const std::string& name, const std::vector<std::pair<std::string, std::string>>& files) {
    for (const auto& [file, text] : files) dir.write(name + "/" + file, text);
    dir.write(name + "/tokenizer.json", vocab);
    return hf_prefix_token(lm.runtime->registry(), dir.path() / name, tok);
  };
  // Qwen2-style: no BOS (null), EOS <|im_end|>; config.json's bos_token_id is another token.
  EXPECT_EQ(
      prefix("qwen", {{"config.json", R"({"model_type": "qwen2", "bos_token_id": 40})"},
                      {"tokenizer_config.json",
                       R"({"tokenizer_class": "Qwen2Tokenizer", "bos_token": null, "eos_token": "<|im_end|>"})"}}),
      41);
  // No bos_token at all: the class's default (Qwen2Tokenizer has none; its EOS is <|endoftext|>).
  EXPECT_EQ(prefix("qwen_default", {{"config.json", R"({"model_type": "qwen2", "bos_token_id": 1})"},
                                    {"tokenizer_config.json", R"({"tokenizer_class": "Qwen2TokenizerFast"})"}}),
            40);
  // GPT-2's class: BOS <|endoftext|>; an AddedToken written as a map.
  EXPECT_EQ(prefix("gpt2", {{"config.json", R"({"model_type": "gpt2", "bos_token_id": 3})"}}), 40);
  EXPECT_EQ(prefix("llama", {{"config.json", R"({"model_type": "llama", "bos_token_id": 3})"},
                             {"tokenizer_config.json", R"({"bos_token": {"content": "<s>", "lstrip": false}})"}}),
            1);
  // special_tokens_map.json over tokenizer_config.json, as from_pretrained reads them.
  EXPECT_EQ(prefix("map", {{"config.json", R"({"model_type": "llama"})"},
                           {"tokenizer_config.json", R"({"bos_token": "<s>"})"},
                           {"special_tokens_map.json", R"({"bos_token": "</s>"})"}}),
            2);
  // Neither named (a generic class): nullopt, and loom eval keeps the tokenizer's end of text.
  EXPECT_FALSE(prefix("none", {{"config.json", R"({"model_type": "other", "bos_token_id": 3})"},
                               {"tokenizer_config.json", R"({"tokenizer_class": "PreTrainedTokenizerFast"})"}})
                   .has_value());
}

// The tokenizer class whose defaults an empty context takes is the one a plugin declares
// (Registrar::add_hf_tokenizer_class): found by config.json's model_type or tokenizer_config.json's
// tokenizer_class (its fast twin too), with that plugin's tokens; the run layer knows no class of
// its own. gemma3's Gemma 3 directories take GemmaTokenizer's <bos>.
TEST(EvalHfDirectory, AnEmptyContextTakesTheDefaultsOfTheTokenizerClassAPluginDeclares) {
  test::TempDir dir;
  const WordTokenizer tok;
  const std::string vocab = R"({"model": {"type": "BPE", "vocab": {"a": 3}},
      "added_tokens": [{"id": 7, "content": "<t-bos>"}, {"id": 8, "content": "<t-eos>"}, {"id": 9, "content": "<bos>"},
                       {"id": 10, "content": "<eos>"}, {"id": 11, "content": "<s>"}]})";
  auto prefix = [&](const Registry& registry, const std::string& name,
                    const std::vector<std::pair<std::string, std::string>>& files) {
    fs::create_directories(dir.path() / name);
    for (const auto& [file, text] : files) dir.write(name + "/" + file, text);
    dir.write(name + "/tokenizer.json", vocab);
    return hf_prefix_token(registry, dir.path() / name, tok);
  };
  RuntimeOptions options;
  options.plugin_paths = {(fs::path(LOOM_FIXTURE_DIR) / "hf_tokenizer").string()};
  options.default_plugin_path = false;
  const Runtime fixtures(options);
  const Registry& registry = fixtures.registry();
  EXPECT_EQ(prefix(registry, "by_type", {{"config.json", R"({"model_type": "test_tok_arch", "bos_token_id": 3})"}}), 7);
  EXPECT_EQ(prefix(registry, "by_class",
                   {{"config.json", R"({"model_type": "llama"})"},
                    {"tokenizer_config.json", R"({"tokenizer_class": "TestTokenizerFast"})"}}),
            7);
  // The directory's own tokens still come first.
  EXPECT_EQ(prefix(registry, "named",
                   {{"config.json", R"({"model_type": "test_tok_arch"})"},
                    {"tokenizer_config.json", R"({"bos_token": "<t-eos>"})"}}),
            8);
  // Without loom's model plugins, no class is Llama's.
  EXPECT_FALSE(prefix(registry, "llama", {{"config.json", R"({"model_type": "llama"})"}}).has_value());
  EXPECT_FALSE(prefix(Registry(), "none", {{"config.json", R"({"model_type": "test_tok_arch"})"}}).has_value());
  // loom's own: Gemma 3 (model_type gemma3_text) reads GemmaTokenizer's defaults, Llama LlamaTokenizer's.
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}");
  EXPECT_EQ(prefix(lm.runtime->registry(), "gemma3", {{"config.json", R"({"model_type": "gemma3_text"})"}}), 9);
  EXPECT_EQ(prefix(lm.runtime->registry(), "gemma", {{"config.json", R"({"model_type": "gemma"})"}}), 9);
  EXPECT_EQ(prefix(lm.runtime->registry(), "llama_own", {{"config.json", R"({"model_type": "mixtral"})"}}), 11);
  EXPECT_EQ(prefix(lm.runtime->registry(), "code_llama",
                   {{"config.json", R"({"model_type": "other"})"},
                    {"tokenizer_config.json", R"({"tokenizer_class": "CodeLlamaTokenizerFast"})"}}),
            11);
  EXPECT_FALSE(
      prefix(lm.runtime->registry(), "test_type", {{"config.json", R"({"model_type": "test_tok_arch"})"}}).has_value());
}

// `loom eval` computes in float32 unless the command line asks otherwise.
TEST(EvalHfDirectory, LoomEvalComputesInFloat32UnlessAsked) {
  test::TempDir dir;
  auto with = [&](const std::string& backend, const std::vector<std::string>& overrides) {
    RuntimeOptions options;
    options.config = dir.write("c.yaml", backend);
    options.overrides = overrides;
    const Runtime runtime(options);
    return float32_products_override(runtime, overrides);
  };
  EXPECT_EQ(with("backend: {type: cpu, matmul_precision: bf16}\n", {}), "backend.matmul_precision=f32");
  EXPECT_EQ(with("model: {type: gpt2}\n", {"model.seq_len=8"}), "backend.matmul_precision=f32");
  EXPECT_FALSE(with("backend: {type: cpu}\n", {"backend.matmul_precision=bf16"}).has_value());
  EXPECT_FALSE(with("backend: {type: cpu}\n", {"backend={type: reference}"}).has_value());
  EXPECT_FALSE(with("backend: {type: reference}\n", {}).has_value());  // no such option: float64 loops anyway
}

TEST(EvalHfDirectory, EveryExportedArchitectureIsDescribedByItsConfigJson) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> models = {
      {"gpt2",
       "{type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, mlp_scale: 3, "
       "tie_word_embeddings: false, layer_norm_epsilon: 1.0e-6}"},
      {"llama",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, head_dim: 16, tie_word_embeddings: true, use_bias: true, "
       "rope: {type: llama3, factor: 4.0, original_max_position_embeddings: 16, theta: 500000.0}}"},
      {"mistral",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 1, sliding_window: 8, rope: {theta: 1.0e6}}"},
      {"qwen2",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 3, num_heads: 4, "
       "num_kv_heads: 2, qkv_bias: true, sliding_window: 8, max_window_layers: 1, "
       "rope: {type: default, factor: 2.0}}"},
      {"qwen3",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 3, num_heads: 4, "
       "num_kv_heads: 1, head_dim: 16, use_qk_norm: true, tie_word_embeddings: true, sliding_window: 8, "
       "max_window_layers: 2, rope: {theta: 1.0e6}}"},
      {"mixtral",
       "{type: llama, seq_len: 32, hidden_dim: 32, intermediate_dim: 24, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, moe: {num_experts: 4, experts_per_token: 2}}"},
      {"gemma2",
       "{type: gemma, seq_len: 32, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: 4, "
       "num_kv_heads: 2, head_dim: 8, query_pre_attn_scalar: 12, final_logit_softcapping: null, "
       "sliding_window: 8}"}};
  for (const auto& [type, yaml] : models) {
    SCOPED_TRACE(type);
    Lm lm = make_lm(dir, yaml);
    const Value exported = dynamic_cast<const HfModel&>(*lm.model).hf_config();
    ASSERT_EQ(exported.find("model_type")->as_string(), type);
    const auto described = described_model(dir, *lm.runtime, type, to_json(exported));
    EXPECT_EQ(to_json(dynamic_cast<const HfModel&>(*described).hf_config()).dump(), to_json(exported).dump());
  }

  // Fields a hub config.json leaves out take transformers' defaults (MistralConfig: 8 key/value
  // heads, a 4096 window, rope_theta 10000), as the plugin's check assumes.
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}");
  const auto mistral = described_model(dir, *lm.runtime, "sparse",
                                       {{"model_type", "mistral"},
                                        {"hidden_size", 64},
                                        {"intermediate_size", 96},
                                        {"num_hidden_layers", 1},
                                        {"num_attention_heads", 16},
                                        {"vocab_size", 64},
                                        {"max_position_embeddings", 64}});
  const Value back = dynamic_cast<const HfModel&>(*mistral).hf_config();
  EXPECT_EQ(back.find("num_key_value_heads")->as_int(), 8);
  EXPECT_EQ(back.find("sliding_window")->as_int(), 4096);
  EXPECT_EQ(back.find("head_dim")->as_int(), 4);
  // Qwen3Config's: a head width of 128 whatever the hidden size, 32 key/value heads, q/k norms.
  const auto qwen3 = described_model(dir, *lm.runtime, "sparse_qwen3",
                                     {{"model_type", "qwen3"},
                                      {"hidden_size", 64},
                                      {"intermediate_size", 96},
                                      {"num_hidden_layers", 1},
                                      {"num_attention_heads", 32},
                                      {"vocab_size", 64}});
  const Value qwen3_back = dynamic_cast<const HfModel&>(*qwen3).hf_config();
  EXPECT_EQ(qwen3_back.find("model_type")->as_string(), "qwen3");
  EXPECT_EQ(qwen3_back.find("head_dim")->as_int(), 128);
  EXPECT_EQ(qwen3_back.find("num_key_value_heads")->as_int(), 32);
  EXPECT_EQ(qwen3_back.find("max_position_embeddings")->as_int(), 32768);

  // What cannot be described is one error naming it, and how to give a config instead.
  auto error_of = [&](const std::string& name, const std::string& config_json, bool tokenizer) {
    fs::create_directories(dir.path() / name);
    dir.write(name + "/config.json", config_json);
    if (tokenizer) dir.write(name + "/tokenizer.model", "");
    try {
      describe_hf_model_dir(lm.runtime->registry(), dir.path() / name);
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string bert = error_of("bert", R"({"model_type": "bert"})", true);
  EXPECT_NE(bert.find("model_type \"bert\""), std::string::npos) << bert;
  EXPECT_NE(bert.find("gemma2"), std::string::npos) << bert;
  EXPECT_NE(bert.find("loom eval " + (dir.path() / "bert").string() + " CONFIG"), std::string::npos) << bert;
  const std::string none = error_of("none", R"({"model_type": "gpt2"})", false);
  EXPECT_NE(none.find("no tokenizer files loom reads (tokenizer.json"), std::string::npos) << none;
  EXPECT_NE(none.find("CONFIG"), std::string::npos) << none;
  const std::string typed = error_of("typed", R"({"model_type": "gpt2", "n_embd": "wide"})", true);
  EXPECT_NE(typed.find("n_embd is \"wide\", expected an integer"), std::string::npos) << typed;
  EXPECT_NE(bert.find("qwen3"), std::string::npos) << bert;
  const std::string broken = error_of("broken", "{", true);
  EXPECT_NE(broken.find("is not valid JSON"), std::string::npos) << broken;
}

// The plugin that claims a directory's model_type (Registrar::add_hf_architectures) maps its
// config.json; an unknown model_type lists exactly the types the loaded plugins claim. With the
// test plugins alone, gpt2 is unknown and test_arch is the test plugin's model.
TEST(EvalHfDirectory, ThePluginClaimingTheModelTypeDescribesTheDirectory) {
  test::TempDir dir;
  auto describe = [&](const Registry& registry, const std::string& name, const std::string& config_json) {
    fs::create_directories(dir.path() / name);
    dir.write(name + "/config.json", config_json);
    dir.write(name + "/tokenizer.model", "");
    try {
      return describe_hf_model_dir(registry, dir.path() / name).model.to_flow();
    } catch (const UserError& e) {
      return std::string(e.what());
    }
  };
  RuntimeOptions options;
  options.plugin_paths = {(fs::path(LOOM_FIXTURE_DIR) / "hf").string()};
  options.default_plugin_path = false;
  const Runtime fixtures(options);
  EXPECT_EQ(describe(fixtures.registry(), "claimed", R"({"model_type": "test_arch", "width": 5})"),
            "{type: test_hf_a, width: 5}");
  EXPECT_EQ(describe(fixtures.registry(), "default", R"({"model_type": "test_arch"})"), "{type: test_hf_a, width: 7}");
  const std::string how =
      "; give a loom config that describes the model and its tokenizer after the directory "
      "instead (`loom eval " +
      (dir.path() / "gpt2").string() + " CONFIG --tasks ...`)";
  EXPECT_EQ(describe(fixtures.registry(), "gpt2", R"({"model_type": "gpt2"})"),
            "'" + (dir.path() / "gpt2" / "config.json").string() +
                "' has model_type \"gpt2\"; loom reads test_arch (test_hf_a)" + how);
  // The plugin's field readers name the file and the field.
  const std::string wide = describe(fixtures.registry(), "wide", R"({"model_type": "test_arch", "width": "x"})");
  EXPECT_EQ(wide.rfind("'" + (dir.path() / "wide" / "config.json").string() +
                           "': width is \"x\", expected an integer; give a loom config",
                       0),
            0u)
      << wide;
  // No plugin claims anything.
  const Registry empty;
  const std::string none = describe(empty, "none", R"({"model_type": "gpt2"})");
  EXPECT_NE(none.find("' has model_type \"gpt2\"; loom reads no Hugging Face model_type: no loaded model plugin "
                      "claims one; give a loom config"),
            std::string::npos)
      << none;
  // loom's own model plugins: each claims its types, listed by model.
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}");
  const std::string bert = describe(lm.runtime->registry(), "bert", R"({"model_type": "bert"})");
  for (const char* claim : {"gemma2 (gemma)", "gpt2 (gpt2)", "llama, mistral, qwen2, qwen3, mixtral (llama)"})
    EXPECT_NE(bert.find(claim), std::string::npos) << bert;
}

class EvalScorer : public ::testing::TestWithParam<std::string> {};

TEST_P(EvalScorer, AgreesWithTokenByTokenScoringInEveryMode) {
  test::TempDir dir;
  Lm lm = make_lm(dir, GetParam());
  std::mt19937 rng(5);
  auto tokens = [&](std::size_t n) {
    std::vector<std::int32_t> t(n);
    for (auto& x : t) x = static_cast<std::int32_t>(rng() % 64);
    return t;
  };
  // Documents of 4 choices after one context (multi-token and single-token continuations), a
  // duplicate, and a request longer than the context (kept to its last tokens).
  std::vector<TokenRequest> requests;
  std::vector<std::size_t> groups;
  for (std::size_t doc = 0; doc < 5; ++doc) {
    const auto context = tokens(3 + doc * 4);
    for (std::size_t c = 0; c < 4; ++c) requests.push_back({context, tokens(doc == 2 ? 1 : 1 + (c + doc) % 5)});
    groups.push_back(4);
  }
  requests.push_back(requests[1]);
  requests.push_back({tokens(70), tokens(6)});
  groups.push_back(1);
  groups.push_back(1);

  DocumentBoundary boundary{{63}, true};
  std::vector<double> expected;
  for (const auto& r : requests) {
    std::vector<std::int32_t> context = r.context;
    const std::size_t keep = 64 + 1 - r.continuation.size();
    if (context.size() > keep) context.erase(context.begin(), context.end() - static_cast<std::ptrdiff_t>(keep));
    const auto lls = log_likelihoods(*lm.model, *lm.backend, boundary, context, r.continuation, ContextPolicy::stop);
    double sum = 0;
    for (const double x : lls) sum += x;
    expected.push_back(sum);
  }
  for (const KvCacheUse kv : {KvCacheUse::never, KvCacheUse::always, KvCacheUse::automatic})
    for (const std::int64_t batch : {1, 3, 16}) {
      Scorer scorer(*lm.model, *lm.backend, ScorerOptions{batch, kv});
      const auto got = scorer.score_grouped(requests, groups);
      ASSERT_EQ(got.size(), requests.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i].logprob, expected[i], 1e-4)
            << "request " << i << ", batch " << batch << ", kv " << static_cast<int>(kv);
      if (kv != KvCacheUse::never) {
        EXPECT_EQ(scorer.stats().requests, static_cast<std::int64_t>(requests.size()));
      }
    }
  // greedy: the argmax continuation is greedy, another token is not.
  Scorer scorer(*lm.model, *lm.backend, ScorerOptions{4, KvCacheUse::never});
  const std::vector<std::int32_t> context = tokens(5);
  TokenStream stream(*lm.model, *lm.backend, boundary, ContextPolicy::stop);
  stream.start(context);
  const auto& logits = stream.logits();
  const auto best = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const auto got = scorer.score(std::vector<TokenRequest>{{context, {best}}, {context, {(best + 1) % 64}}});
  EXPECT_TRUE(got[0].greedy);
  EXPECT_FALSE(got[1].greedy);
}

// The cases of EvalScorer, in the order of its values.
std::string scorer_case_name(const ::testing::TestParamInfo<std::string>& info) {
  static const char* const names[] = {"gpt2", "llama_gqa", "llama_moe", "gemma_softcap_window"};
  return names[info.index];
}

INSTANTIATE_TEST_SUITE_P(Models, EvalScorer,
                         ::testing::Values("{type: gpt2, seq_len: 64, hidden_dim: 32, num_layers: 2, num_heads: 2, "
                                           "initializer_range: 0.5}",
                                           "{type: llama, seq_len: 64, hidden_dim: 32, intermediate_dim: 64, "
                                           "num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: null, "
                                           "initializer_range: 0.5}",
                                           // A mixture of experts (top-2 of 4).
                                           "{type: llama, seq_len: 64, hidden_dim: 32, intermediate_dim: 48, "
                                           "num_layers: 2, num_heads: 4, num_kv_heads: 2, head_dim: null, "
                                           "moe: {num_experts: 4, experts_per_token: 2}, initializer_range: 0.5}",
                                           // Soft-capped logits, a sliding window shorter than the requests.
                                           "{type: gemma, seq_len: 64, hidden_dim: 32, intermediate_dim: 64, "
                                           "num_layers: 2, num_heads: 2, num_kv_heads: 1, head_dim: 16, "
                                           "query_pre_attn_scalar: 16, attn_logit_softcapping: 50, "
                                           "final_logit_softcapping: 30, sliding_window: 12, initializer_range: 0.5}"),
                         scorer_case_name);

TEST(EvalScorer, KvCacheRunsTheContextOnce) {
  test::TempDir dir;
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 64, hidden_dim: 32, num_layers: 2, num_heads: 2}");
  const std::vector<std::int32_t> context(40, 7);
  std::vector<TokenRequest> requests;
  for (int c = 0; c < 4; ++c) requests.push_back({context, {static_cast<std::int32_t>(c), 2, 1}});
  const std::vector<std::size_t> groups{4};
  Scorer cached(*lm.model, *lm.backend, ScorerOptions{8, KvCacheUse::always});
  cached.score_grouped(requests, groups);
  // The context once, then the 4 choices' first two tokens after it.
  EXPECT_EQ(cached.stats().tokens_run, 40 + 4 * 2);
  EXPECT_EQ(cached.stats().forward_passes, 2);
  // The harness's way: each choice a row of context and choice (4 x 42).
  Scorer plain(*lm.model, *lm.backend, ScorerOptions{8, KvCacheUse::never});
  plain.score_grouped(requests, groups);
  EXPECT_EQ(plain.stats().tokens_run, 4 * 42);
  // Choices that differ in their last token alone have one input: one row, with or without the cache.
  std::vector<TokenRequest> letters;
  for (int c = 0; c < 4; ++c) letters.push_back({context, {1, 2, static_cast<std::int32_t>(c)}});
  Scorer once(*lm.model, *lm.backend, ScorerOptions{8, KvCacheUse::always});
  once.score_grouped(letters, groups);
  EXPECT_EQ(once.stats().tokens_run, 42);
  EXPECT_EQ(once.stats().forward_passes, 1);
}

TEST(EvalScorer, BadRequestsAreUserErrors) {
  test::TempDir dir;
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 16, hidden_dim: 32, num_layers: 1, num_heads: 2}");
  Scorer scorer(*lm.model, *lm.backend, ScorerOptions{});
  EXPECT_THROW(scorer.score(std::vector<TokenRequest>{{{1}, std::vector<std::int32_t>(17, 1)}}), UserError);
  EXPECT_THROW(Scorer(*lm.model, *lm.backend, ScorerOptions{0, KvCacheUse::always}), UserError);
}

// A continuation whose tokens merged into the context's last one ("pre" + "fix") scores as the
// harness's HFLM scores it (its logits cache serves it from a one-token choice of the same
// context): log-likelihood 0, greedy; the other choices as usual, with the cache or without.
TEST(EvalScorer, AContinuationMergedIntoTheContextScoresZeroAndGreedy) {
  test::TempDir dir;
  Lm lm = make_lm(dir, "{type: gpt2, seq_len: 64, hidden_dim: 32, num_layers: 2, num_heads: 2}");
  const WordTokenizer tok;
  const Task task = task_from(
      dir, "multiple_choice", "merged.jsonl",
      R"({"context": "the word is pre", "choices": ["fix", " text", " long text"], "label": 0, "target_delimiter": ""})"
      "\n");
  for (const KvCacheUse cache : {KvCacheUse::always, KvCacheUse::never}) {
    EvalOptions options;
    options.scorer.kv_cache = cache;
    options.log_samples = true;
    const auto results = evaluate_tasks(*lm.model, *lm.backend, tok, 63, {task}, options);
    ASSERT_EQ(results[0].samples.size(), 1u);
    const auto& scored = results[0].samples[0].results;
    ASSERT_EQ(scored.size(), 3u);
    EXPECT_EQ(scored[0].logprob, 0.0);
    EXPECT_TRUE(scored[0].greedy);
    EXPECT_LT(scored[1].logprob, 0.0);
    EXPECT_LT(scored[2].logprob, 0.0);
    EXPECT_EQ(results[0].samples[0].pred, 0);
  }
  Scorer scorer(*lm.model, *lm.backend, ScorerOptions{});
  const auto alone = scorer.score(std::vector<TokenRequest>{{{1, 2}, {}}});
  EXPECT_EQ(alone[0].logprob, 0.0);
  EXPECT_TRUE(alone[0].greedy);
}

// ---- The command, as a user runs it ----

test::CommandResult loom(const std::vector<std::string>& args) {
  std::vector<std::string> argv{LOOM_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run_command(argv);
}

void train(const fs::path& config, const fs::path& run_dir, std::vector<std::string> overrides = {}) {
  std::vector<std::string> args{"train", config.string(), "trainer.run_dir=" + run_dir.string()};
  args.insert(args.end(), overrides.begin(), overrides.end());
  const auto r = loom(args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

nlohmann::json eval_json(const std::vector<std::string>& args, const fs::path& out) {
  std::vector<std::string> all{"eval"};
  all.insert(all.end(), args.begin(), args.end());
  all.insert(all.end(), {"-o", out.string(), "--log-samples"});
  const auto r = loom(all);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream f(out);
  return nlohmann::json::parse(f);
}

const char* kTinyRun = R"(model: {type: gpt2, seq_len: 256, hidden_dim: 32, num_layers: 2, num_heads: 2}
backend: {type: cpu, matmul_precision: f32}
tokenizer: byte
data: {type: synthetic, num_documents: 200}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
trainer: {num_train_steps: 4, train_batch_size: 4, log_every: 2, steps_per_eval: 0, max_eval_batches: 1,
          sample_length: 0, trackers: [jsonl], peak_flops: 1.0e9}
)";

std::string example_tasks() {
  const fs::path dir = fs::path(LOOM_SOURCE_DIR) / "configs/eval";
  return (dir / "piqa.jsonl").string() + "," + (dir / "winogrande.jsonl").string() + "," +
         (dir / "lambada.jsonl").string() + "," + (dir / "wikitext.txt").string();
}

std::vector<double> all_loglikelihoods(const nlohmann::json& results) {
  std::vector<double> out;
  for (const auto& [task, docs] : results["samples"].items())
    for (const auto& doc : docs)
      for (const auto& ll : doc["loglikelihoods"]) out.push_back(ll.get<double>());
  return out;
}

// A LoRA run scores with its adapters: as its merged export, read back as a Hugging Face directory
// into the base model's config, and not as its base model.
TEST(EvalCommand, LoraRunAndHuggingFaceDirectoryScoreTheSameModel) {
  test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", kTinyRun);
  train(config, dir.path() / "base");
  train(config, dir.path() / "lora",
        {"trainer.init_from=" + (dir.path() / "base").string(), "lora.rank=4", "lora.alpha=8",
         "optimizer.learning_rate=0.1"});
  const auto r =
      loom({"export", (dir.path() / "lora").string(), "--format", "hf", (dir.path() / "hf").string(), "--merge-lora"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto base = all_loglikelihoods(
      eval_json({(dir.path() / "base").string(), "--tasks", example_tasks()}, dir.path() / "b.json"));
  const auto lora = all_loglikelihoods(
      eval_json({(dir.path() / "lora").string(), "--tasks", example_tasks()}, dir.path() / "l.json"));
  const auto hf = all_loglikelihoods(
      eval_json({(dir.path() / "hf").string(), config.string(), "--tasks", example_tasks()}, dir.path() / "h.json"));
  ASSERT_EQ(lora.size(), hf.size());
  ASSERT_EQ(lora.size(), base.size());
  double moved = 0;
  for (std::size_t i = 0; i < lora.size(); ++i) {
    EXPECT_NEAR(lora[i], hf[i], 1e-4) << i;
    moved = std::max(moved, std::abs(lora[i] - base[i]));
  }
  EXPECT_GT(moved, 1e-2);  // the adapters changed the scores
}

// A LoRA run whose base is stored in fewer bits (lora.base_dtype) scores with its adapters,
// applied in the products (a quantized weight has no float32 value to merge them into): as its
// merged export does, and not as the same run at a learning rate of zero (its stored base alone).
TEST(EvalCommand, LoraRunOnAStoredBaseScoresWithItsAdapters) {
  test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", kTinyRun);
  train(config, dir.path() / "base");
  for (const std::string format : {"bf16", "int8", "nf4"}) {
    SCOPED_TRACE(format);
    const std::vector<std::string> lora = {"trainer.init_from=" + (dir.path() / "base").string(), "lora.rank=4",
                                           "lora.alpha=8", "lora.base_dtype=" + format};
    auto with = [&](const std::string& rate) {
      auto o = lora;
      o.push_back("optimizer.learning_rate=" + rate);
      return o;
    };
    const fs::path trained_dir = dir.path() / ("lora-" + format), still_dir = dir.path() / ("still-" + format);
    train(config, trained_dir, with("0.1"));
    train(config, still_dir, with("0"));
    const fs::path hf_dir = dir.path() / ("hf-" + format);
    const auto r = loom({"export", trained_dir.string(), "--format", "hf", hf_dir.string(), "--merge-lora"});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    const auto said = loom({"eval", trained_dir.string(), "--tasks", example_tasks(), "--limit", "2"});
    EXPECT_NE(said.err.find("with its LoRA adapters applied to its " + format + " base"), std::string::npos)
        << said.err;
    const auto trained = all_loglikelihoods(
        eval_json({trained_dir.string(), "--tasks", example_tasks()}, dir.path() / ("t-" + format + ".json")));
    const auto still = all_loglikelihoods(
        eval_json({still_dir.string(), "--tasks", example_tasks()}, dir.path() / ("s-" + format + ".json")));
    const auto hf = all_loglikelihoods(eval_json({hf_dir.string(), config.string(), "--tasks", example_tasks()},
                                                 dir.path() / ("h-" + format + ".json")));
    ASSERT_EQ(trained.size(), still.size());
    ASSERT_EQ(trained.size(), hf.size());
    double moved = 0;
    for (std::size_t i = 0; i < trained.size(); ++i) {
      // The export adds the adapters to the dequantized weights: the same model, rounded otherwise.
      EXPECT_NEAR(trained[i], hf[i], 1e-4 * std::max(1.0, std::abs(hf[i]))) << i;
      moved = std::max(moved, std::abs(trained[i] - still[i]));
    }
    EXPECT_GT(moved, 1e-2) << "the trained adapters change the scores";
  }
}

TEST(EvalCommand, BadInputIsOneErrorWithStatus2) {
  test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", kTinyRun);
  train(config, dir.path() / "run");
  const std::string run = (dir.path() / "run").string();
  auto expect_error = [&](const std::vector<std::string>& args, const std::string& text) {
    const auto r = loom(args);
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
  };
  expect_error({"eval", run, "--tasks", "helaswag"}, "neither a task");
  expect_error({"eval", run}, "no tasks given");
  expect_error({"eval", (dir.path() / "nowhere").string(), "--tasks", example_tasks()}, "does not exist");
  expect_error({"eval", run, "--tasks", example_tasks(), "--batch-size", "0"}, "--batch-size must be at least 1");
  const fs::path bad = dir.write("piqa_bad.jsonl", "{\"goal\": \"g\"}\n");
  expect_error({"eval", run, "--tasks", bad.string()}, "piqa_bad.jsonl:1: no \"sol1\" field");
  // A document longer than the model's context (256 bytes), named by file and line, before any scoring.
  const fs::path long_doc =
      dir.write("piqa_long.jsonl",
                "{\"goal\": \"g\", \"sol1\": \"a\", \"sol2\": \"b\", \"label\": 0}\n{\"goal\": \"g\", \"sol1\": \"" +
                    std::string(300, 'x') + "\", \"sol2\": \"b\", \"label\": 0}\n");
  expect_error(
      {"eval", run, "--tasks", long_doc.string()},
      "piqa_long.jsonl:2: choice 0's continuation is 301 tokens, longer than the model's context of 256 tokens");
  expect_error({"eval", run, "--tasks", dir.write("empty.txt", "").string()},
               "empty.txt' is empty: a perplexity task needs text to score");
  fs::create_directories(dir.path() / "piqa_dir.jsonl");
  expect_error({"eval", run, "--tasks", (dir.path() / "piqa_dir.jsonl").string()}, "is a directory");
  fs::create_directories(dir.path() / "hf");
  dir.write("hf/config.json", "{}");
  expect_error({"eval", (dir.path() / "hf").string(), "--tasks", example_tasks()}, "has no model_type");
  expect_error({"eval", (dir.path() / "hf").string(), "--tasks", example_tasks()},
               "give a loom config that describes the model and its tokenizer after the directory instead");
}

// `loom eval` scores in float32 whatever the run trained with (here bf16 products, on a CPU with
// AVX512-BF16), unless the command line asks for bf16.
TEST(EvalCommand, ScoresInFloat32UnlessTheCommandLineAsksForBf16) {
  test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", kTinyRun);
  train(config, dir.path() / "run", {"backend.matmul_precision=bf16"});
  const std::string run = (dir.path() / "run").string();
  const auto plain = all_loglikelihoods(eval_json({run, "--tasks", example_tasks()}, dir.path() / "plain.json"));
  const auto f32 = all_loglikelihoods(
      eval_json({run, "backend.matmul_precision=f32", "--tasks", example_tasks()}, dir.path() / "f32.json"));
  const auto bf16 = all_loglikelihoods(
      eval_json({run, "backend.matmul_precision=bf16", "--tasks", example_tasks()}, dir.path() / "bf16.json"));
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(plain, f32);
  ASSERT_EQ(bf16.size(), f32.size());
  double moved = 0;
  for (std::size_t i = 0; i < f32.size(); ++i) moved = std::max(moved, std::abs(bf16[i] - f32[i]));
  std::cout << "bf16 products moved a log-likelihood by up to " << moved << " nats\n";
}

// A Hugging Face directory whose config.json or tokenizer.json holds a value of the wrong type, or
// sizes no machine could hold, or whose path is not UTF-8, is one clear error with status 2 naming
// the file, the key, what it holds and what was expected (not nlohmann's type_error, not
// std::bad_alloc).
TEST(EvalCommand, AHuggingFaceDirectoryWithBadValuesIsOneClearError) {
  test::TempDir dir;
  auto expect_error = [&](const fs::path& hf, const std::string& text) {
    const auto r = loom({"eval", hf.string(), "--tasks", example_tasks()});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(text), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("type_error"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("bad_alloc"), std::string::npos) << r.err;
  };
  auto hf_dir = [&](const std::string& name, const std::string& config) {
    fs::create_directories(dir.path() / name);
    dir.write(name + "/config.json", config);
    return dir.path() / name;
  };
  const std::string llama =
      R"("model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, )"
      R"("num_attention_heads": 4, "vocab_size": 300)";
  const fs::path rope = hf_dir("rope", "{" + llama + R"(, "rope_scaling": {"rope_type": "linear", "factor": "abc"}})");
  expect_error(rope, (rope / "config.json").string() + "': rope_scaling.factor is \"abc\", expected a number");
  const fs::path rope_type = hf_dir("rope_type", "{" + llama + R"(, "rope_scaling": {"rope_type": 3}})");
  expect_error(rope_type, "': rope_scaling.rope_type is 3, expected a string");
  const fs::path scaling = hf_dir("scaling", "{" + llama + R"(, "rope_scaling": [1, 2]})");
  expect_error(scaling, "': rope_scaling is [1,2], expected an object");

  // Sizes: out of a dimension's range, and a model larger than this machine's memory.
  const fs::path layers = hf_dir("layers", R"({"model_type": "gpt2", "n_layer": 1e12})");
  expect_error(layers, (layers / "config.json").string() + "': n_layer is 1000000000000.0, expected an integer");
  const fs::path huge_layers = hf_dir("huge_layers", R"({"model_type": "gpt2", "n_layer": 1000000000000})");
  expect_error(huge_layers, "': n_layer is 1000000000000, expected a positive integer of at most 2147483647");
  const fs::path vocab = hf_dir("vocab", R"({"model_type": "gpt2", "vocab_size": 1099511627776})");
  expect_error(vocab, "': vocab_size is 1099511627776, expected a positive integer of at most 2147483647");
  const fs::path big = hf_dir("big", R"({"model_type": "gpt2", "vocab_size": 2000000000, "n_embd": 65536})");
  expect_error(big, (big / "config.json").string() +
                        "': vocab_size 2000000000, n_embd 65536, n_layer 12 and n_inner 262144 describe a model of at "
                        "least 1.31e+14 parameters");
  const fs::path window = hf_dir("window", R"({"model_type": "gemma2", "sliding_window": 1e300})");
  expect_error(window, "': sliding_window is 1e+300, expected null or a number of positions from 0 to 2147483647");
  const fs::path llama_big =
      hf_dir("llama_big", R"({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 2000000000})");
  expect_error(llama_big, "more than this machine's");

  // tokenizer.json's model.type of the wrong type.
  const fs::path tokenizer = hf_dir("tokenizer", "{" + llama + "}");
  dir.write("tokenizer/tokenizer.json", R"({"model": {"type": 5}, "pre_tokenizer": null})");
  expect_error(tokenizer, (tokenizer / "tokenizer.json").string() + "': model.type is 5, expected a string");
  const fs::path model_list = hf_dir("model_list", "{" + llama + "}");
  dir.write("model_list/tokenizer.json", R"({"model": [1]})");
  expect_error(model_list, "tokenizer.json': model is [1], expected an object");

  // A directory whose name holds byte 0xff: its tokenizer's paths cannot go into a config.
  const fs::path bytes = hf_dir(std::string("bytes-\xff"), "{" + llama + "}");
  dir.write(std::string("bytes-\xff/tokenizer.json"), R"({"model": {"type": "BPE"}})");
  expect_error(bytes, "the directory's path is not valid UTF-8 (byte 0xff at offset " +
                          std::to_string((dir.path() / "bytes-").string().size()) + ")");
}

// A Hugging Face directory written by `loom export --format hf` scores without a config: its
// config.json gives the model, its vocab.json and merges.txt the tokenizer, and the scores are
// the run's own (overrides after the directory still apply).
TEST(EvalCommand, HuggingFaceDirectoryScoresWithoutAConfig) {
  const fs::path gpt2 = fs::path(LOOM_DATA_DIR) / "gpt2";
  ASSERT_TRUE(fs::exists(gpt2 / "encoder.json")) << "GPT-2's vocabulary ships with the repository: " << gpt2;
  test::TempDir dir;
  const std::string tokenizer = "tokenizer: {type: gpt2-bpe, encoder_json: " + (gpt2 / "encoder.json").string() +
                                ", vocab_bpe: " + (gpt2 / "vocab.bpe").string() + "}\n";
  const std::string rest = R"(backend: {type: cpu, matmul_precision: f32}
data: {type: synthetic, num_documents: 50}
optimizer: {type: adamw, learning_rate: 1.0e-2}
lr_schedule: constant
trainer: {num_train_steps: 2, train_batch_size: 2, log_every: 1, steps_per_eval: 0, max_eval_batches: 1,
          sample_length: 0, trackers: [jsonl], peak_flops: 1.0e9}
)";
  const std::vector<std::pair<std::string, std::string>> models = {
      {"gpt2", "model: {type: gpt2, seq_len: 64, hidden_dim: 32, num_layers: 1, num_heads: 2}\n"},
      {"qwen2",
       "model: {type: llama, seq_len: 64, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: "
       "4, num_kv_heads: 2, qkv_bias: true}\n"},
      {"qwen3",
       "model: {type: llama, seq_len: 64, hidden_dim: 32, intermediate_dim: 48, num_layers: 2, num_heads: "
       "4, num_kv_heads: 1, head_dim: 16, use_qk_norm: true, tie_word_embeddings: true}\n"}};
  for (const auto& [name, model] : models) {
    SCOPED_TRACE(name);
    const fs::path config = dir.write(name + ".yaml", model + tokenizer + rest);
    const fs::path run = dir.path() / name, hf = dir.path() / (name + "-hf");
    train(config, run);
    const auto r = loom({"export", run.string(), "--format", "hf", hf.string()});
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    ASSERT_TRUE(fs::exists(hf / "merges.txt"));
    const auto from_run =
        all_loglikelihoods(eval_json({run.string(), "--tasks", example_tasks()}, dir.path() / (name + "-run.json")));
    const auto from_hf = all_loglikelihoods(eval_json(
        {hf.string(), "backend.matmul_precision=f32", "--tasks", example_tasks()}, dir.path() / (name + "-hf.json")));
    ASSERT_EQ(from_run.size(), from_hf.size());
    ASSERT_FALSE(from_run.empty());
    for (std::size_t i = 0; i < from_run.size(); ++i) EXPECT_NEAR(from_run[i], from_hf[i], 1e-5) << i;
  }
}

// trainer.eval_tasks: scored every steps_per_task_eval steps and at the end, logged as
// eval/<task>/<metric> and printed; the run's header.json is what `loom report` shows of it.
TEST(EvalTraining, EvalTasksAreLoggedAndPrinted) {
  test::TempDir dir;
  const fs::path config = dir.write("tiny.yaml", kTinyRun);
  const fs::path run = dir.path() / "run";
  const fs::path examples = fs::path(LOOM_SOURCE_DIR) / "configs/eval";
  const auto r = loom(
      {"train", config.string(), "trainer.run_dir=" + run.string(),
       "trainer.eval_tasks=[" + (examples / "piqa.jsonl").string() + "," + (examples / "lambada.jsonl").string() + "]",
       "trainer.steps_per_task_eval=2", "trainer.checkpoint.save_every_steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("tasks at step 2: piqa acc "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tasks at step 4: piqa acc "), std::string::npos) << r.out;
  // The final task evaluation comes after the final weights and checkpoint: it can cost neither.
  const std::size_t final_checkpoint = r.out.find("step-4: ");
  ASSERT_NE(final_checkpoint, std::string::npos) << r.out;
  EXPECT_LT(final_checkpoint, r.out.find("tasks at step 4: ")) << r.out;
  std::ifstream metrics(run / "metrics.jsonl");
  std::map<std::int64_t, nlohmann::json> by_step;
  for (std::string line; std::getline(metrics, line);) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("eval/piqa/acc")) by_step[row["step"].get<std::int64_t>()] = row;
  }
  ASSERT_EQ(by_step.size(), 2u);
  EXPECT_TRUE(by_step.count(2) && by_step.count(4));
  EXPECT_TRUE(by_step[4].contains("eval/piqa/acc_norm"));
  EXPECT_TRUE(by_step[4].contains("eval/lambada/perplexity"));
  // The same scores as `loom eval` of the final weights.
  const auto final_eval =
      eval_json({run.string(), "--tasks", (examples / "lambada.jsonl").string()}, dir.path() / "e.json");
  EXPECT_NEAR(by_step[4]["eval/lambada/perplexity"].get<double>(),
              final_eval["results"]["lambada"]["perplexity"].get<double>(),
              1e-6 * final_eval["results"]["lambada"]["perplexity"].get<double>());

  const RunRecord record = read_run(run);
  EXPECT_NE(record.trainer_header.find("model: gpt2"), std::string::npos) << record.trainer_header;
  EXPECT_TRUE(record.header.count("parameters"));
  EXPECT_TRUE(record.header.count("memory estimate"));
  EXPECT_NE(render_report_html({record}, ReportAxis::step).find("Evaluation: piqa"), std::string::npos);

  // A bad task file stops the run before its first step.
  const auto bad = loom({"train", config.string(), "trainer.run_dir=" + (dir.path() / "bad").string(),
                         "trainer.eval_tasks=[nowhere.jsonl]"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out << bad.err;
  EXPECT_NE(bad.err.find("while reading trainer.eval_tasks"), std::string::npos) << bad.err;
  EXPECT_EQ(bad.out.find("step 2/4"), std::string::npos);
  // So does a document longer than the model's context (piqa's 165-byte solution against a context
  // of 128 bytes), named by file and line, and a perplexity file without text: before step 1.
  for (const auto& [task, text] :
       std::vector<std::pair<std::string, std::string>>{{(examples / "piqa.jsonl").string(), "piqa.jsonl:"},
                                                        {dir.write("empty.txt", "").string(), "empty.txt' is empty"}}) {
    const fs::path short_run = dir.path() / ("short-" + std::to_string(text.size()));
    const auto too_long = loom({"train", config.string(), "trainer.run_dir=" + short_run.string(), "model.seq_len=128",
                                "trainer.eval_tasks=[" + task + "]"});
    EXPECT_EQ(too_long.exit_code, 2) << too_long.out << too_long.err;
    EXPECT_NE(too_long.err.find(text), std::string::npos) << too_long.err;
    EXPECT_EQ(too_long.out.find("step 2/4"), std::string::npos) << too_long.out;
  }
}

}  // namespace
}  // namespace loom::eval
