// Agreement with lm-evaluation-harness itself (docs/evaluation.md): a small GPT-2 with GPT-2's BPE
// is trained, exported with `loom export --format hf`, and scored on the same task files (two
// dozen generated documents per family, in each task's format) by the harness's own
// simple_evaluate with its transformers backend and by `loom eval`, with and without the shared
// KV cache: every per-request log-likelihood agrees within 1e-4, every greedy flag and accuracy is
// identical, the perplexities agree. Skips, saying why, without lm-eval in the reference
// environment (scripts/setup-python-env.sh installs it) or without GPT-2's vocabulary files.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "reference_required.hpp"
#include "test_support.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace loom {
namespace {

const std::vector<std::string> kWords = {
    "the",   "a",   "cat",   "dog",  "sat",   "on",  "mat",  "and",  "ran",    "to",      "house", "river",  "green",
    "small", "big", "old",   "man",  "woman", "saw", "bird", "in",   "garden", "tree",    "water", "with",   "of",
    "blue",  "red", "apple", "book", "read",  "Sun", "came", "went", "home",   "Kitchen", "door",  "slowly", "quickly"};

struct Words {
  std::mt19937 rng{11};
  std::string sentence(int lo, int hi) {
    const int n = lo + static_cast<int>(rng() % static_cast<unsigned>(hi - lo + 1));
    std::string s;
    for (int i = 0; i < n; ++i) s += (i ? " " : "") + kWords[rng() % kWords.size()];
    return s;
  }
  int pick(int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); }
};

void write_lines(const fs::path& file, const std::vector<json>& docs) {
  std::ofstream out(file);
  for (const auto& d : docs) out << d.dump() << "\n";
}

// Two dozen documents per family in the harness's field names.
void write_tasks(const fs::path& dir) {
  fs::create_directories(dir);
  Words w;
  const int n = 24;
  std::vector<json> hs, arc_e, arc_c, piqa, wino, mmlu, lambada, mine, glued, text;
  // Whitespace beyond ASCII (Python's strip(), rstrip() and \s remove it) and letters whose case
  // maps beyond ASCII ("ß".capitalize() is "Ss").
  const std::vector<std::string> spaces = {"\u00a0", "\u3000", "\u2003", "\u2028", "\u0085"};
  for (int i = 0; i < n; ++i) {
    json endings = json::array();
    for (int c = 0; c < 4; ++c)
      endings.push_back((c == 1 ? "[step] " : "") + w.sentence(2, 9) + "." + (i % 3 == 1 ? spaces[i % 5] : ""));
    hs.push_back({{"activity_label", w.sentence(1, 2)},
                  {"ctx_a", w.sentence(4, 12) + (i % 3 == 0 ? " [title] " + w.sentence(2, 4) : "") + "."},
                  {"ctx_b", i % 4 == 0   ? ""
                            : i % 4 == 1 ? "\u00dftra\u00dfe \u00c9LAN \u00fcBER " + w.sentence(1, 3)
                                         : "The " + w.sentence(1, 3)},
                  {"endings", endings},
                  {"label", std::to_string(w.pick(4))}});
    for (auto* arc : {&arc_e, &arc_c}) {
      const int k = 3 + w.pick(3);
      json text_list = json::array(), labels = json::array();
      for (int c = 0; c < k; ++c) {
        text_list.push_back(w.sentence(1, 4));
        labels.push_back(i % 2 ? std::string(1, static_cast<char>('A' + c)) : std::to_string(c + 1));
      }
      arc->push_back({{"question", w.sentence(4, 10) + "?"},
                      {"choices", {{"text", text_list}, {"label", labels}}},
                      {"answerKey", labels[static_cast<std::size_t>(w.pick(k))]}});
    }
    piqa.push_back(
        {{"goal", w.sentence(3, 8)}, {"sol1", w.sentence(3, 12)}, {"sol2", w.sentence(3, 12)}, {"label", w.pick(2)}});
    // A blank that ends the sentence (every fourth): an empty target, which a few-shot example
    // writes without delimiters.
    wino.push_back({{"sentence", w.sentence(3, 7) + (i % 4 == 3 ? " _" : " _ " + w.sentence(2, 6) + ".")},
                    {"option1", w.sentence(1, 2)},
                    {"option2", w.sentence(1, 2)},
                    {"answer", std::to_string(1 + w.pick(2))}});
    mmlu.push_back({{"question", w.sentence(5, 12) + "?"},
                    {"subject", "anatomy"},
                    {"choices", {w.sentence(1, 3), w.sentence(1, 3), w.sentence(1, 3), w.sentence(1, 3)}},
                    {"answer", w.pick(4)}});
    lambada.push_back({{"text", w.sentence(15, 40)}});
    json choices = json::array();
    const int k = 2 + w.pick(3);
    for (int c = 0; c < k; ++c) choices.push_back(w.sentence(1, 6));
    mine.push_back({{"context", w.sentence(3, 10) + (i % 5 == 0   ? " "
                                                     : i % 5 == 1 ? spaces[i % 4]
                                                                  : "")},
                    {"choices", choices},
                    {"label", w.pick(k)}});
    // Glued to the context (target_delimiter ""): " pre" + "fix" is GPT-2's one token " prefix", so
    // that choice has no token of its own; " pre" + "x" and " text" are one token each after " pre".
    if (i < 8)
      glued.push_back({{"context", w.sentence(3, 8) + " pre"},
                       {"choices", {"x", "fix", " " + w.sentence(1, 1)}},
                       {"label", w.pick(3)},
                       {"target_delimiter", ""}});
    if (i < 6)
      text.push_back(
          {{"text", w.sentence(20, 90) + "." + spaces[i % 5] + w.sentence(3, 9) + "\n" + w.sentence(5, 20)}});
  }
  write_lines(dir / "hellaswag.jsonl", hs);
  write_lines(dir / "arc_easy.jsonl", arc_e);
  write_lines(dir / "arc_challenge.jsonl", arc_c);
  write_lines(dir / "piqa.jsonl", piqa);
  write_lines(dir / "winogrande.jsonl", wino);
  write_lines(dir / "mmlu.jsonl", mmlu);
  write_lines(dir / "lambada.jsonl", lambada);
  write_lines(dir / "my_task.jsonl", mine);
  write_lines(dir / "my_task_glued.jsonl", glued);
  write_lines(dir / "perplexity.jsonl", text);
}

void run_ok(const std::vector<std::string>& argv) {
  const auto r = test::run_command(argv);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
}

// Compares `loom eval -o --log-samples`'s results with the harness's: every per-request
// log-likelihood within 1e-4, every greedy flag, acc and acc_norm equal, the rest to 1e-5
// relative. Counts the requests compared into `compared`.
void compare_with_harness(const json& harness, const json& loom, const std::string& label, int& compared) {
  for (const auto& [name, expected] : harness.items()) {
    if (name == "lm_eval") continue;
    SCOPED_TRACE(name);
    ASSERT_TRUE(loom["samples"].contains(name));
    const json& docs = loom["samples"][name];
    double worst = 0;
    ASSERT_EQ(docs.size(), expected["docs"].size());
    for (std::size_t d = 0; d < docs.size(); ++d) {
      const json& want = expected["docs"][d];
      ASSERT_EQ(docs[d]["loglikelihoods"].size(), want.size()) << "document " << d;
      for (std::size_t r = 0; r < want.size(); ++r) {
        const double got_ll = docs[d]["loglikelihoods"][r].get<double>(), want_ll = want[r][0].get<double>();
        EXPECT_NEAR(got_ll, want_ll, 1e-4) << "document " << d << ", request " << r;
        worst = std::max(worst, std::abs(got_ll - want_ll));
        if (name != "perplexity") {
          EXPECT_EQ(docs[d]["greedy"][r].get<bool>(), want[r][1].get<bool>()) << "document " << d << ", request " << r;
        }
        ++compared;
      }
    }
    std::cout << label << "  " << name << ": " << docs.size() << " documents, largest |loglikelihood difference| "
              << worst << "\n";
    const json& got = loom["results"][name];
    for (const auto& [metric, value] : expected["metrics"].items()) {
      if (!value.is_number()) continue;  // "N/A": a standard error the harness does not compute
      ASSERT_TRUE(got.contains(metric)) << metric;
      if (metric.find("_stderr") != std::string::npos) {
        // Of a mean, its formula; of LAMBADA's perplexity, its bootstrap replayed draw for draw
        // (relative 1e-5, as the perplexity itself: the log-likelihoods differ in the 6th digit).
        EXPECT_NEAR(got[metric].get<double>(), value.get<double>(), 1e-5 * std::max(1.0, value.get<double>()))
            << metric;
        continue;
      }
      if (metric == "acc" || metric == "acc_norm")
        EXPECT_DOUBLE_EQ(got[metric].get<double>(), value.get<double>()) << metric;
      else
        EXPECT_NEAR(got[metric].get<double>() / value.get<double>(), 1.0, 1e-5) << metric;
    }
  }
}

TEST(HarnessAgreement, LoomEvalScoresAsTheHarness) {
  std::error_code ec;
  if (!fs::exists(LOOM_REFERENCE_ENV_PYTHON, ec))
    return test::skip_missing_reference(
        std::string("lm-evaluation-harness is not available: no Python environment at ") + LOOM_REFERENCE_ENV_PYTHON +
        " (scripts/setup-python-env.sh makes it)");
  // GPT-2's vocabulary ships with the repository (configs/data/gpt2): not a reference that may be missing.
  const fs::path gpt2 = fs::path(LOOM_DATA_DIR) / "gpt2";
  ASSERT_TRUE(fs::exists(gpt2 / "encoder.json", ec)) << "no GPT-2 vocabulary at " << gpt2;
  test::TempDir work;
  // float32 products (the cpu backend's default is bf16 on a CPU with AVX512-BF16): the
  // harness runs the exported model in float32.
  const auto config = work.write(
      "run.yaml", R"(model: {type: gpt2, seq_len: 128, hidden_dim: 64, num_layers: 2, num_heads: 2, attention: flash}
backend: {type: cpu, matmul_precision: f32}
tokenizer: {type: gpt2-bpe, encoder_json: )" +
                      (gpt2 / "encoder.json").string() + ", vocab_bpe: " + (gpt2 / "vocab.bpe").string() + R"(}
data: {type: synthetic, num_documents: 2000}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: constant
trainer: {seed: 0, num_train_steps: 30, train_batch_size: 8, log_every: 10, steps_per_eval: 0, max_eval_batches: 0,
          sample_length: 0, trackers: [], peak_flops: 1.0e9}
)");
  const fs::path run = work.path() / "run", hf = work.path() / "hf", tasks = work.path() / "tasks";
  run_ok({LOOM_BINARY, "train", config.string(), "trainer.run_dir=" + run.string()});
  run_ok({LOOM_BINARY, "export", run.string(), "--format", "hf", hf.string()});
  write_tasks(tasks);

  const auto h = test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_HARNESS_REFERENCE_SCRIPT, hf.string(),
                                    tasks.string(), (work.path() / "harness.json").string()});
  if (h.exit_code == 77) return test::skip_missing_reference(h.err.substr(h.err.rfind("lm-evaluation-harness")));
  ASSERT_EQ(h.exit_code, 0) << h.out << h.err;
  std::ifstream harness_file(work.path() / "harness.json");
  const json harness = json::parse(harness_file);

  std::string task_list;
  for (const auto& entry : fs::directory_iterator(tasks))
    task_list += (task_list.empty() ? "" : ",") +
                 std::string(entry.path().stem() == "perplexity" ? "perplexity:" : "") + entry.path().string();
  for (const bool kv_cache : {true, false}) {  // --kv-cache always, never
    SCOPED_TRACE(kv_cache ? "with the KV cache" : "without the KV cache");
    const fs::path out = work.path() / (kv_cache ? "loom.json" : "loom_plain.json");
    std::vector<std::string> argv{LOOM_BINARY, "eval",       run.string(),    "--tasks",      task_list,
                                  "-o",        out.string(), "--log-samples", "--batch-size", "5"};
    argv.insert(argv.end(), {"--kv-cache", kv_cache ? "always" : "never"});
    run_ok(argv);
    std::ifstream loom_file(out);
    const json loom = json::parse(loom_file);
    int compared = 0;
    compare_with_harness(harness, loom, kv_cache ? "kv cache   " : "no kv cache", compared);
    EXPECT_GT(compared, 9 * 24);
  }

  // Few-shot (--num-fewshot 2): the harness's random sampler with its K + 1 draws (hellaswag,
  // winogrande: partial scoring after the examples), with its K draws (lambada, whose examples
  // carry the target delimiter before the target's own space), and mmlu's first_n after its
  // description.
  const std::string fewshot_tasks = "hellaswag,winogrande,lambada,mmlu";
  const auto hf_shot = test::run_command({LOOM_REFERENCE_ENV_PYTHON, LOOM_HARNESS_REFERENCE_SCRIPT, hf.string(),
                                          tasks.string(), (work.path() / "harness_fewshot.json").string(), "--tasks",
                                          fewshot_tasks, "--num-fewshot", "2"});
  ASSERT_EQ(hf_shot.exit_code, 0) << hf_shot.out << hf_shot.err;
  std::ifstream harness_shot_file(work.path() / "harness_fewshot.json");
  const json harness_shot = json::parse(harness_shot_file);
  ASSERT_EQ(harness_shot.size(), 5u);  // the four tasks and the version
  std::string shot_list;
  for (const char* name : {"hellaswag", "winogrande", "lambada", "mmlu"})
    shot_list += (shot_list.empty() ? "" : ",") + (tasks / (std::string(name) + ".jsonl")).string();
  const fs::path shot_out = work.path() / "loom_fewshot.json";
  run_ok({LOOM_BINARY, "eval", run.string(), "--tasks", shot_list, "--num-fewshot", "2", "-o", shot_out.string(),
          "--log-samples", "--batch-size", "5"});
  std::ifstream loom_shot_file(shot_out);
  int compared = 0;
  compare_with_harness(harness_shot, json::parse(loom_shot_file), "2-shot     ", compared);
  EXPECT_GT(compared, 4 * 24);
}

}  // namespace
}  // namespace loom
