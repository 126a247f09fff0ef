// Fine-tuning data in the trainer: weighted mixtures of datasets (proportions, schedules, each
// dataset's sequences in its own order, resume, per-dataset evaluation, config errors) and
// supervised fine-tuning on chat data (the loss counts the answers only, and falls).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/test_support.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/run_config.hpp"
#include "loom/run/tokenize.hpp"
#include "loom/run/trainer.hpp"
#include "train/mixture.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

const char* mixture_config = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash}
tokenizer: byte
data:
  mixture:
    a: {type: synthetic, num_documents: 300, grammar_seed: 1}
    b: {type: synthetic, num_documents: 300, grammar_seed: 2}
    c: {type: synthetic, num_documents: 300, grammar_seed: 3}
  weights: {a: 0.6, b: 0.3, c: 0.1}
  weight_schedule:
    - {step: 1000, weights: {a: 0, b: 1, c: 1}}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 2}
trainer:
  num_train_steps: 8
  train_batch_size: 8
  log_every: 2
  steps_per_eval: 4
  max_eval_batches: 2
  sample_length: 0
  peak_flops: 1.0e9
  run_id: mix
  trackers: [jsonl]
  checkpoint: {save_every_steps: 4, keep_last: 10}
)";

struct Loaded {
  std::unique_ptr<Runtime> runtime;
  Value config;
};

Loaded load(const test::TempDir& tmp, const std::string& text, std::vector<std::string> overrides = {}) {
  const fs::path file = tmp.write("run.yaml", text);
  RuntimeOptions options;
  options.config = file;
  options.overrides = std::move(overrides);
  Loaded l;
  l.runtime = std::make_unique<Runtime>(options);
  l.config = resolved_run_config(*l.runtime);
  return l;
}

std::unique_ptr<training::MixtureDataset> prepared_mixture(const Loaded& l, std::int64_t batch_size) {
  auto ds = std::make_unique<training::MixtureDataset>(l.runtime->registry(), *l.config.find("data"));
  auto tokenizer = l.runtime->registry().create<Tokenizer>(ComponentRef{"tokenizer", "byte", Value("byte"), "tok"});
  ds->prepare(DatasetSetup{tokenizer, 32, batch_size, 7, 256});
  return ds;
}

std::vector<double> proportions(const training::MixtureDataset& ds, std::int64_t first, std::int64_t batches) {
  std::vector<double> counts(ds.parts().size(), 0);
  double rows = 0;
  for (std::int64_t b = first; b < first + batches; ++b)
    for (const auto d : ds.row_sources(b)) {
      ++counts[static_cast<std::size_t>(d)];
      ++rows;
    }
  for (auto& c : counts) c /= rows;
  return counts;
}

TEST(Mixture, ProportionsOverAThousandBatchesFollowTheWeights) {
  test::TempDir tmp;
  const Loaded l = load(tmp, mixture_config);
  const auto ds = prepared_mixture(l, 8);
  const auto p = proportions(*ds, 0, 1000);
  std::cout << "observed over batches 0-999 (weights 0.6 0.3 0.1): " << p[0] << " " << p[1] << " " << p[2] << "\n";
  EXPECT_NEAR(p[0], 0.6, 0.01);
  EXPECT_NEAR(p[1], 0.3, 0.01);
  EXPECT_NEAR(p[2], 0.1, 0.01);
  // Systematic sampling: every batch holds the floor or the ceiling of each share (4.8, 2.4, 0.8 rows).
  for (std::int64_t b = 0; b < 100; ++b) {
    std::vector<int> n(3, 0);
    for (const auto d : ds->row_sources(b)) ++n[static_cast<std::size_t>(d)];
    EXPECT_TRUE(n[0] == 4 || n[0] == 5) << b;
    EXPECT_TRUE(n[1] == 2 || n[1] == 3) << b;
    EXPECT_TRUE(n[2] == 0 || n[2] == 1) << b;
  }
  // From step 1000 the schedule's weights: a none, b and c half each.
  const auto q = proportions(*ds, 1000, 1000);
  std::cout << "observed over batches 1000-1999 (weights 0 0.5 0.5): " << q[0] << " " << q[1] << " " << q[2] << "\n";
  EXPECT_EQ(q[0], 0.0);
  EXPECT_NEAR(q[1], 0.5, 0.01);
  EXPECT_NEAR(q[2], 0.5, 0.01);
  const auto before = proportions(*ds, 999, 1);
  EXPECT_GT(before[0], 0.0);
}

TEST(Mixture, EachDatasetGivesItsOwnSequencesInOrder) {
  test::TempDir tmp;
  const Loaded l = load(tmp, mixture_config);
  const auto ds = prepared_mixture(l, 8);
  // Dataset d's rows across mixture batches, in order, are its own batches' rows in order: no
  // sequence skipped or repeated.
  std::vector<std::vector<std::int32_t>> served(3);
  Batch b;
  for (std::int64_t i = 0; i < 40; ++i) {
    ds->batch(Split::train, i, b);
    const auto sources = ds->row_sources(i);
    for (std::size_t r = 0; r < sources.size(); ++r)
      served[static_cast<std::size_t>(sources[r])].insert(served[static_cast<std::size_t>(sources[r])].end(),
                                                          b.inputs.begin() + static_cast<std::ptrdiff_t>(r * 32),
                                                          b.inputs.begin() + static_cast<std::ptrdiff_t>(r * 32 + 32));
  }
  for (std::size_t d = 0; d < 3; ++d) {
    std::vector<std::int32_t> own;
    Batch m;
    for (std::int64_t i = 0; own.size() < served[d].size(); ++i) {
      ds->parts()[d].dataset->batch(Split::train, i, m);
      own.insert(own.end(), m.inputs.begin(), m.inputs.end());
    }
    own.resize(served[d].size());
    EXPECT_EQ(served[d], own) << "dataset " << ds->parts()[d].name;
  }
}

TEST(Mixture, BatchesAreAPureFunctionOfTheIndex) {
  test::TempDir tmp;
  const Loaded l = load(tmp, mixture_config);
  const auto walked = prepared_mixture(l, 8);
  Batch b;
  for (std::int64_t i = 0; i < 700; ++i) walked->batch(Split::train, i, b);
  const auto fresh = prepared_mixture(l, 8);
  Batch x, y;
  for (std::int64_t i : {699, 3, 256, 512, 0}) {
    walked->batch(Split::train, i, x);
    fresh->batch(Split::train, i, y);
    EXPECT_EQ(x.inputs, y.inputs) << i;
    EXPECT_EQ(x.targets, y.targets) << i;
  }
}

// mixture_config with another data section.
std::string with_data(const std::string& data) {
  const std::string text = mixture_config;
  return text.substr(0, text.find("data:")) + data + text.substr(text.find("optimizer:"));
}

std::string error_of(const test::TempDir& tmp, const std::string& data) {
  try {
    load(tmp, with_data(data));
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(Mixture, ConfigErrorsSayWhatIsWrong) {
  test::TempDir tmp;
  const std::string two = "data:\n  mixture:\n    a: {type: synthetic}\n    b: {type: synthetic}\n";
  EXPECT_NE(error_of(tmp, two + "  weights: {a: 1, bb: 1}\n").find("data.weights.bb: no dataset 'bb'"),
            std::string::npos);
  EXPECT_NE(error_of(tmp, two + "  weights: {a: 1}\n").find("no weight for dataset 'b'"), std::string::npos);
  EXPECT_NE(error_of(tmp, two + "  weights: {a: 0, b: 0}\n").find("add up to 0"), std::string::npos);
  EXPECT_NE(error_of(tmp, two + "  weights: {a: -1, b: 1}\n").find("expected a weight >= 0"), std::string::npos);
  EXPECT_NE(error_of(tmp, two + "  wieghts: {a: 1, b: 1}\n").find("did you mean 'weights'"), std::string::npos);
  EXPECT_NE(error_of(tmp, two + "  weight_schedule: [{step: 0, weights: {a: 1, b: 1}}]\n")
                .find("data.weight_schedule[0].step: expected a step above 0"),
            std::string::npos);
  EXPECT_NE(error_of(tmp, "data:\n  mixture:\n    a: {type: synthetic, num_documentz: 3}\n")
                .find("data.mixture.a.num_documentz: unknown option"),
            std::string::npos);
  EXPECT_NE(error_of(tmp, "data:\n  mixture: {}\n").find("data.mixture: expected a map"), std::string::npos);
  // Without weights: equal ones, filled in.
  const Loaded l = load(tmp, with_data(two + "    c: {type: synthetic}\n"));
  EXPECT_EQ(l.config.at_path("data.weights.c")->as_double(), 1.0);
  EXPECT_EQ(l.config.at_path("data.mixture.a.validation_fraction")->as_double(), 0.1);  // a default
  // `loom tokenize CONFIG` takes one dataset's files.
  try {
    tokenize_request_from_config(*l.runtime);
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("data is a mixture of datasets"), std::string::npos) << e.what();
  }
}

using test::read_metrics;

TrainSummary train_with(const test::TempDir& tmp, const std::string& text, std::vector<std::string> overrides,
                        std::string* log = nullptr) {
  const fs::path file = tmp.path() / "train.yaml";
  if (!fs::exists(file)) tmp.write("train.yaml", text);
  RuntimeOptions options;
  options.config = file;
  options.overrides = std::move(overrides);
  Runtime runtime(options);
  std::ostringstream out;
  TrainOptions train_options;
  train_options.out = &out;
  TrainSummary s = train(runtime, train_options);
  if (log) *log = out.str();
  return s;
}

TEST(Mixture, TrainsLogsEachDatasetsLossAndResumesExactly) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full";
  std::string log;
  const TrainSummary s = train_with(tmp, mixture_config, {"trainer.run_dir=" + full.string()}, &log);
  EXPECT_NE(log.find("per dataset: a "), std::string::npos) << log;
  std::vector<std::string> parts;
  double final_eval = -1;
  for (const auto& r : read_metrics(full))
    if (r["step"] == 8 && r.contains("eval/loss")) {
      final_eval = r["eval/loss"];
      for (const char* k : {"eval/a/loss", "eval/b/loss", "eval/c/loss"})
        if (r.contains(k)) parts.push_back(k);
    }
  EXPECT_EQ(parts.size(), 3u);
  EXPECT_EQ(final_eval, s.final_eval_loss);
  // Text data masks no target: every token is trained, and the log line says nothing more.
  for (const auto& r : read_metrics(full))
    if (r.contains("train/loss")) {
      EXPECT_EQ(r["throughput/trained_tokens_per_second"], r["throughput/tokens_per_second"]);
    }
  EXPECT_EQ(log.find(" trained)"), std::string::npos) << log;

  const fs::path resumed = tmp.path() / "resumed";
  train_with(tmp, mixture_config,
             {"trainer.run_dir=" + resumed.string(), "trainer.resume=" + (full / "checkpoints" / "step-4").string()});
  std::ifstream a(full / "model.safetensors", std::ios::binary), b(resumed / "model.safetensors", std::ios::binary);
  const std::string wa((std::istreambuf_iterator<char>(a)), {}), wb((std::istreambuf_iterator<char>(b)), {});
  ASSERT_FALSE(wa.empty());
  EXPECT_EQ(wa, wb);
}

// configs/sft-tiny.yaml, shortened: the chat data's masked loss falls, and the log says how many
// of the tokens are trained.
TEST(SupervisedFineTuning, TheMaskedLossFalls) {
  const fs::path config = fs::path(LOOM_SOURCE_DIR) / "configs" / "sft-tiny.yaml";
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "sft";
  const fs::path cwd = fs::current_path();
  fs::current_path(LOOM_SOURCE_DIR);  // the config's data paths are relative to the repository
  RuntimeOptions options;
  options.config = config;
  options.overrides = {"trainer.run_dir=" + dir.string(), "trainer.num_train_steps=40",
                       "trainer.steps_per_eval=20",       "trainer.log_every=10",
                       "lr_schedule.warmup=10",           "trainer.trackers=[jsonl]"};
  std::ostringstream out;
  TrainSummary s;
  {
    Runtime runtime(options);
    TrainOptions train_options;
    train_options.out = &out;
    s = train(runtime, train_options);
  }
  fs::current_path(cwd);
  std::vector<double> train_loss, eval_loss;
  double all_rate = 0, trained_rate = 0;
  for (const auto& r : read_metrics(dir)) {
    if (r.contains("train/loss")) {
      train_loss.push_back(r["train/loss"]);
      all_rate = r["throughput/tokens_per_second"];
      trained_rate = r["throughput/trained_tokens_per_second"];
    }
    if (r.contains("eval/loss")) eval_loss.push_back(r["eval/loss"]);
  }
  ASSERT_EQ(train_loss.size(), 4u);
  ASSERT_EQ(eval_loss.size(), 2u);
  std::cout << "masked train loss " << train_loss.front() << " -> " << train_loss.back() << ", eval " << eval_loss[0]
            << " -> " << eval_loss[1] << "\n";
  // From about ln(256) = 5.5 for bytes; the answers are short and templated.
  EXPECT_GT(train_loss.front(), 3.0);
  EXPECT_LT(train_loss.back(), 0.6 * train_loss.front());
  EXPECT_LT(eval_loss[1], eval_loss[0]);
  // Only the answers count: a fraction of the tokens.
  EXPECT_GT(trained_rate, 0);
  EXPECT_LT(trained_rate, 0.5 * all_rate);
  EXPECT_NE(out.str().find(" trained)"), std::string::npos) << out.str();
}

}  // namespace
}  // namespace loom
