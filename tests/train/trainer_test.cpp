// The trainer end to end on tiny models: run directory contents, determinism, gradient
// accumulation equal to one big batch, divergence stops, generation from a finished run.
#include "loom/run/trainer.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/test_support.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/safetensors.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

const char* tiny_config = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash}
tokenizer: byte
data: {type: synthetic, num_documents: 400}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 2}
trainer:
  num_train_steps: 6
  train_batch_size: 4
  log_every: 2
  steps_per_eval: 3
  max_eval_batches: 2
  sample_length: 8
  trackers: [jsonl, tensorboard]
)";

using test::all_weights;
using test::read_metrics;
using TinyRun = test::TrainedRun;

TinyRun train_tiny(const test::TempDir& dir, const std::string& name, std::vector<std::string> overrides = {}) {
  return test::train_in(dir.write(name + ".yaml", tiny_config), dir.path() / name, std::move(overrides));
}

TEST(Trainer, WritesTheRunDirectory) {
  test::TempDir dir;
  const TinyRun run = train_tiny(dir, "a");
  EXPECT_TRUE(fs::exists(run.dir / "config.yaml"));
  EXPECT_TRUE(fs::exists(run.dir / "model.safetensors"));
  EXPECT_TRUE(fs::is_directory(run.dir / "tensorboard"));
  std::ifstream generation_info(run.dir / "generation.json");
  EXPECT_EQ(nlohmann::json::parse(generation_info), nlohmann::json({{"separator_ends_documents", true}}));
  const auto records = read_metrics(run.dir);
  ASSERT_FALSE(records.empty());
  // Logged every 2 steps: 2, 4, 6, each with loss, lr, grad norm, tokens/s and MFU.
  std::vector<std::int64_t> logged;
  for (const auto& r : records)
    if (r.contains("train/loss")) {
      logged.push_back(r["step"]);
      for (const char* key : {"train/lr", "train/grad_norm", "throughput/tokens_per_second", "throughput/mfu"})
        EXPECT_TRUE(r.contains(key)) << key;
    }
  EXPECT_EQ(logged, (std::vector<std::int64_t>{2, 4, 6}));
  // Evaluated at step 3 and at the end.
  int evals = 0;
  for (const auto& r : records) evals += r.contains("eval/loss");
  EXPECT_EQ(evals, 2);
  // Plain log lines (not a TTY), the eval, the sample and the closing line.
  EXPECT_NE(run.log.find("step 2/6  loss "), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("eval at step 3: loss "), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("sample:\n"), std::string::npos) << run.log;
  EXPECT_NE(run.log.find("done: 6 steps"), std::string::npos) << run.log;
  EXPECT_GT(run.summary.tokens_per_second, 0);
  EXPECT_GT(run.summary.final_eval_loss, 0);
}

// The header names the precision the matrix products compute in (the backend's matmul_dtype():
// by default bf16 on a CPU with AVX512-BF16, float32 elsewhere) and the probe measures that
// precision's roof.
TEST(Trainer, TheHeaderSaysWhatTheMatrixProductsComputeIn) {
  __builtin_cpu_init();
  const bool bf16 =
      __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  test::TempDir dir;
  const std::vector<std::string> short_run = {"trainer.num_train_steps=2", "trainer.sample_length=0"};
  auto with = [&](std::string more) {
    auto o = short_run;
    o.push_back(std::move(more));
    return o;
  };
  const TinyRun by_default = train_tiny(dir, "default", short_run);
  if (bf16) {
    EXPECT_NE(by_default.log.find("; matmuls in bf16 (float32 accumulation); peak "), std::string::npos)
        << by_default.log;
    EXPECT_NE(by_default.log.find(" GFLOP/s (bf16 GEMM probe)"), std::string::npos) << by_default.log;
  } else {
    EXPECT_NE(by_default.log.find("; matmuls in f32; peak "), std::string::npos) << by_default.log;
    EXPECT_NE(by_default.log.find(" GFLOP/s (f32 GEMM probe)"), std::string::npos) << by_default.log;
  }
  const TinyRun f32 = train_tiny(dir, "f32", with("backend.matmul_precision=f32"));
  EXPECT_NE(f32.log.find("; matmuls in f32; peak "), std::string::npos) << f32.log;
  // A float32 run where bf16 kernels exist also shows the bf16 roof.
  EXPECT_NE(f32.log.find(bf16 ? " GFLOP/s (f32 GEMM probe; bf16 GEMM roof " : " GFLOP/s (f32 GEMM probe)"),
            std::string::npos)
      << f32.log;
  const TinyRun given = train_tiny(dir, "given", with("trainer.peak_flops=2e9"));
  EXPECT_NE(given.log.find(std::string("; matmuls in ") + (bf16 ? "bf16" : "f32")), std::string::npos) << given.log;
  EXPECT_NE(given.log.find("peak 2.0 GFLOP/s (trainer.peak_flops)"), std::string::npos) << given.log;
}

TEST(Trainer, TheLossFalls) {
  test::TempDir dir;
  const TinyRun run = train_tiny(dir, "a", {"trainer.num_train_steps=40", "trainer.log_every=5"});
  const auto records = read_metrics(run.dir);
  double first = -1, last = -1;
  for (const auto& r : records)
    if (r.contains("train/loss")) {
      if (first < 0) first = r["train/loss"];
      last = r["train/loss"];
    }
  // A byte-level model starts near ln(256) = 5.5 and learns the grammar's letters quickly.
  EXPECT_GT(first, 4.0);
  EXPECT_LT(last, first - 1.5) << "first " << first << ", last " << last;
}

TEST(Trainer, SameConfigAndSeedGiveBitIdenticalWeights) {
  test::TempDir dir;
  train_tiny(dir, "a");
  train_tiny(dir, "b");
  EXPECT_EQ(all_weights(dir.path() / "a" / "model.safetensors"), all_weights(dir.path() / "b" / "model.safetensors"));
  train_tiny(dir, "c", {"trainer.seed=1"});
  EXPECT_NE(all_weights(dir.path() / "a" / "model.safetensors"), all_weights(dir.path() / "c" / "model.safetensors"));
}

TEST(Trainer, MicroBatchesGiveTheSameResultAsOneBigBatch) {
  test::TempDir dir;
  train_tiny(dir, "whole");
  train_tiny(dir, "micro", {"trainer.microbatch_size=1"});
  const auto whole = all_weights(dir.path() / "whole" / "model.safetensors");
  const auto micro = all_weights(dir.path() / "micro" / "model.safetensors");
  ASSERT_EQ(whole.size(), micro.size());
  double max_diff = 0, max_abs = 0;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    max_diff = std::max(max_diff, static_cast<double>(std::abs(whole[i] - micro[i])));
    max_abs = std::max(max_abs, static_cast<double>(std::abs(whole[i])));
  }
  EXPECT_LT(max_diff, 1e-4 * max_abs) << "max difference " << max_diff;
  EXPECT_GT(max_diff, 0.0) << "accumulation should differ from one batch by float rounding only, not be the same code";
}

TEST(Trainer, MicroBatchMustDivideTheBatch) {
  test::TempDir dir;
  try {
    train_tiny(dir, "a", {"trainer.microbatch_size=3"});
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("trainer.train_batch_size (4) must be a multiple of the micro-batch size (3)"),
              std::string::npos)
        << e.what();
  }
}

nlohmann::json read_end(const fs::path& run) {
  std::ifstream in(run / "end.json");
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The step a divergence error names ("step 2: the loss is NaN ..."), counted as the metrics count.
std::int64_t named_step(const std::string& msg) {
  const auto at = msg.find("step ");
  return at == std::string::npos ? -1 : std::stoll(msg.substr(at + 5));
}

TEST(Trainer, DivergenceStopsNamingTheStep) {
  test::TempDir dir;
  try {
    train_tiny(dir, "a",
               {"optimizer.learning_rate=1.0e+30", "optimizer.max_grad_norm=0", "lr_schedule.warmup=0",
                "trainer.log_every=1"});
    FAIL() << "expected the run to diverge";
  } catch (const UserError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the run diverged"), std::string::npos) << msg;
    // The first step trains from finite weights; its 1e30 update makes the second one's loss NaN.
    EXPECT_EQ(named_step(msg), 2) << msg;
    // end.json says how the run ended, and the metrics hold the step that diverged (JSON's null).
    const nlohmann::json end = read_end(dir.path() / "a");
    ASSERT_TRUE(end.is_object()) << "no end.json";
    EXPECT_EQ(end["status"], "diverged");
    EXPECT_EQ(end["step"], 2);
    EXPECT_EQ(end["num_steps"], 6);
    EXPECT_TRUE(end["reason"] == "NaN loss" || end["reason"] == "infinite loss") << end.dump();
    EXPECT_EQ(end["message"], e.message());
    EXPECT_TRUE(end["time"].is_string());
    const auto records = read_metrics(dir.path() / "a");
    ASSERT_EQ(records.size(), 2u);
    EXPECT_EQ(records[0]["step"], 1);
    EXPECT_TRUE(records[0]["train/loss"].is_number());
    EXPECT_EQ(records[1]["step"], 2);
    EXPECT_TRUE(records[1]["train/loss"].is_null()) << records[1].dump();
  }
}

// A finished run records so; resumed further, its record is replaced by how the resumed run ended.
TEST(Trainer, EndOfARunIsRecordedAndReplacedOnResume) {
  test::TempDir dir;
  train_tiny(dir, "a", {"trainer.checkpoint.save_every_steps=3"});
  nlohmann::json end = read_end(dir.path() / "a");
  ASSERT_TRUE(end.is_object()) << "no end.json";
  EXPECT_EQ(end["status"], "finished");
  EXPECT_EQ(end["step"], 6);
  EXPECT_EQ(end["message"], "");
  try {
    train_tiny(dir, "a",
               {"trainer.checkpoint.save_every_steps=3", "trainer.num_train_steps=8", "optimizer.learning_rate=1.0e+30",
                "optimizer.max_grad_norm=0", "lr_schedule.warmup=0"});
    FAIL() << "expected the resumed run to diverge";
  } catch (const UserError& e) {
    EXPECT_EQ(named_step(e.what()), 8) << e.what();
  }
  end = read_end(dir.path() / "a");
  EXPECT_EQ(end["status"], "diverged");
  EXPECT_EQ(end["step"], 8);
  EXPECT_EQ(end["num_steps"], 8);
}

TEST(Trainer, AnExistingRunIsNeverOverwritten) {
  test::TempDir dir;
  train_tiny(dir, "a");
  try {
    train_tiny(dir, "a");
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("already holds a run"), std::string::npos) << e.what();
  }
}

TEST(Trainer, MissingSectionIsAUserError) {
  test::TempDir dir;
  const auto file =
      dir.write("run.yaml", "model: {type: gpt2, seq_len: 16, hidden_dim: 16, num_layers: 1, num_heads: 1}\n");
  RuntimeOptions options;
  options.config = file;
  Runtime runtime(options);
  try {
    train(runtime);
    FAIL();
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the config has no `data` section"), std::string::npos) << e.what();
  }
}

// With a threshold at the window's mean (sigma 1e-3) and a learning rate high enough to make the
// loss jump about, steps that exceed it in loss or gradient norm are skipped: the count is
// reported, and each skipped step leaves the weights as they were. With the rule off, the same run
// skips nothing.
TEST(Trainer, SkipBadStepsRunsAndReportsSkips) {
  test::TempDir dir;
  const std::vector<std::string> rule{"trainer.skip_bad_steps=true",   "trainer.skip_step_window=2",
                                      "trainer.skip_step_sigma=0.001", "trainer.log_every=1",
                                      "trainer.num_train_steps=10",    "optimizer.learning_rate=0.1"};
  const TinyRun run = train_tiny(dir, "a", rule);
  EXPECT_EQ(run.summary.steps, 10);
  EXPECT_GT(run.summary.skipped_steps, 0);
  EXPECT_LE(run.summary.skipped_steps, 8);  // the first two steps fill the window: never skipped
  double reported = -1;
  for (const auto& r : read_metrics(run.dir))
    if (r.contains("train/skipped_steps")) reported = r["train/skipped_steps"].get<double>();
  EXPECT_EQ(reported, static_cast<double>(run.summary.skipped_steps));

  auto off = rule;
  off[0] = "trainer.skip_bad_steps=false";
  const TinyRun plain = train_tiny(dir, "b", off);
  EXPECT_EQ(plain.summary.skipped_steps, 0);
  for (const auto& r : read_metrics(plain.dir)) EXPECT_EQ(r.value("train/skipped_steps", 0.0), 0.0);
  // A skipped step is not applied: the weights differ from the run that applied every step.
  EXPECT_NE(all_weights(run.dir / "model.safetensors"), all_weights(plain.dir / "model.safetensors"));
}

// A NaN or infinite loss (crash_on_nan and crash_on_inf off) is skipped and never enters the
// window: the threshold stays finite and the next outlier is still caught.
TEST(SkipStepRule, NonFiniteStepsAreSkippedAndNeverEnterTheWindow) {
  for (const double bad : {std::nan(""), double{INFINITY}, -double{INFINITY}}) {
    SkipStepRule rule(/*window=*/8, /*sigma=*/3.0);
    for (int i = 0; i < 8; ++i) EXPECT_FALSE(rule.should_skip(2.0 + 0.01 * (i % 2), 1.0 + 0.01 * (i % 3)));
    const auto before = rule.losses();
    EXPECT_TRUE(rule.should_skip(bad, 1.0)) << bad;
    EXPECT_TRUE(rule.should_skip(2.0, bad)) << bad;
    EXPECT_EQ(rule.losses(), before);  // what a checkpoint's state.json saves
    for (double x : rule.grad_norms()) EXPECT_TRUE(std::isfinite(x));
    EXPECT_TRUE(rule.should_skip(10.0, 1.0)) << "a loss spike after " << bad;
    EXPECT_TRUE(rule.should_skip(2.0, 50.0)) << "a gradient-norm spike after " << bad;
  }
  // A window saved with NaN in it (by an older loom) is restored without them.
  SkipStepRule restored(8, 3.0);
  restored.restore({2.0, std::nan(""), 2.01, 2.0, 2.01, 2.0}, {1.0, 1.0, INFINITY, 1.01, 1.0, 1.01});
  EXPECT_EQ(restored.losses(), (std::vector<double>{2.0, 2.0, 2.01, 2.0}));
  EXPECT_EQ(restored.grad_norms(), (std::vector<double>{1.0, 1.01, 1.0, 1.01}));
  EXPECT_TRUE(restored.should_skip(10.0, 1.0));
}

TEST(SkipStepRule, SkipsOutliersOnceTheWindowIsHalfFull) {
  SkipStepRule rule(/*window=*/8, /*sigma=*/3.0);
  // Fewer than window / 2 = 4 past steps: never skips, however large.
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(rule.should_skip(i == 3 ? 100.0 : 2.0, 1.0)) << i;
  SkipStepRule steady(8, 3.0);
  for (int i = 0; i < 8; ++i) EXPECT_FALSE(steady.should_skip(2.0 + 0.01 * (i % 2), 1.0 + 0.01 * (i % 3)));
  EXPECT_TRUE(steady.should_skip(10.0, 1.0));  // a loss spike
  EXPECT_TRUE(steady.should_skip(2.0, 50.0));  // a gradient-norm spike
  EXPECT_FALSE(steady.should_skip(2.0, 1.0));  // back to normal (the spikes widened the window's spread)
}

TEST(Generate, ARunCanBeLoadedAndSampledDeterministically) {
  test::TempDir dir;
  train_tiny(dir, "a", {"trainer.num_train_steps=10"});
  RuntimeOptions options;
  options.config = dir.path() / "a" / "config.yaml";
  Runtime runtime(options);
  LoadedRun run = load_run(runtime, dir.path() / "a");
  // The synthetic corpus separates documents with "\n" (the byte tokenizer has no end-of-text
  // token) and has none inside them: a generated "\n" ends a document.
  EXPECT_TRUE(run.documents.separator_ends_documents);
  EXPECT_EQ(run.documents.separator, std::vector<std::int32_t>{'\n'});
  SamplingOptions sampling;
  sampling.max_new_tokens = 12;
  sampling.temperature = 0.9;
  sampling.seed = 7;
  const auto prompt = run.tokenizer->encode("The ");
  const auto first = generate(*run.model, *run.backend, *run.tokenizer, run.documents, prompt, sampling).tokens;
  const auto second = generate(*run.model, *run.backend, *run.tokenizer, run.documents, prompt, sampling).tokens;
  EXPECT_EQ(first.size(), 12u);
  EXPECT_EQ(first, second);
  for (auto t : first) EXPECT_TRUE(t >= 0 && t < 256);
}

// trainer.sample_length longer than the context (32) is not cut: the window slides.
TEST(Trainer, SamplesLongerThanTheContextAreWhole) {
  test::TempDir dir;
  const TinyRun run = train_tiny(dir, "long", {"trainer.num_train_steps=2", "trainer.sample_length=100"});
  EXPECT_EQ(run.summary.final_sample.size(), 100u) << run.summary.final_sample;  // one byte per token
}

TEST(Sampling, TemperatureTopKAndTopP) {
  std::vector<float> logits{1.0f, 3.0f, 2.0f, 0.0f};
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_token(logits, greedy, 0.99), 1);
  SamplingOptions top1;
  top1.top_k = 1;
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(logits, top1, u), 1);
  SamplingOptions top2;
  top2.top_k = 2;
  for (double u : {0.0, 0.3, 0.6, 0.999}) {
    const auto t = sample_token(logits, top2, u);
    EXPECT_TRUE(t == 1 || t == 2);
  }
  SamplingOptions nucleus;
  nucleus.top_p = 0.5;  // token 1 alone has probability 0.64
  for (double u : {0.0, 0.5, 0.999}) EXPECT_EQ(sample_token(logits, nucleus, u), 1);
  // With temperature 1 and no truncation, u walks the distribution in logit order.
  SamplingOptions plain;
  EXPECT_EQ(sample_token(logits, plain, 0.0), 1);
  EXPECT_EQ(sample_token(logits, plain, 0.999), 3);
}

// trainer.ema_decay: training is unchanged, the saved weights are the average. A decay too small
// to register in float (1 - 1e-12 == 1) saves the weights themselves.
TEST(Trainer, EmaDecaySavesTheAverageAndLeavesTrainingAlone) {
  test::TempDir dir;
  const TinyRun plain = train_tiny(dir, "plain");
  const TinyRun averaged = train_tiny(dir, "averaged", {"trainer.ema_decay=0.9"});
  const TinyRun instant = train_tiny(dir, "instant", {"trainer.ema_decay=1e-12"});
  EXPECT_EQ(averaged.summary.final_train_loss, plain.summary.final_train_loss);
  const auto w = all_weights(plain.dir / "model.safetensors");
  const auto a = all_weights(averaged.dir / "model.safetensors");
  EXPECT_EQ(all_weights(instant.dir / "model.safetensors"), w);
  ASSERT_EQ(a.size(), w.size());
  EXPECT_NE(a, w);
  EXPECT_NE(averaged.summary.final_eval_loss, plain.summary.final_eval_loss);
}

// trainer.z_loss_weight adds weight * lse^2 to the training loss (its gradient is checked in
// tests/numerics): a run with it reports a larger loss and still learns.
TEST(Trainer, ZLossWeightAddsToTheTrainingLoss) {
  test::TempDir dir;
  const TinyRun plain = train_tiny(dir, "plain");
  const TinyRun z = train_tiny(dir, "z", {"trainer.z_loss_weight=0.01"});
  EXPECT_GT(z.summary.final_train_loss, plain.summary.final_train_loss);
  EXPECT_TRUE(std::isfinite(z.summary.final_train_loss));
}

// A fuzzed config that ran for minutes without a line after the header (issue 26): soap with
// merge_dims made each 256 x 32 embedding one 8192 x 8192 preconditioner, whose eigendecomposition
// on the first step took minutes. Such a tensor is now a vector (no preconditioner without
// precondition_1d), and the run finishes in about a second.
TEST(Trainer, SoapWithMergeDimsOnATinyModelFinishes) {
  test::TempDir dir;
  const auto config = dir.write("soap.yaml", R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 1, num_heads: 2, attention: naive,
        tie_word_embeddings: false}
tokenizer: byte
data: {type: synthetic, num_documents: 200}
optimizer: {type: soap, learning_rate: 0.113, max_grad_norm: 0.255, beta1: 0.852, beta2: 0.765, shampoo_beta: 0.189,
            weight_decay: 0.053, merge_dims: true}
lr_schedule: {type: linear, decay: 0.537}
trainer:
  num_train_steps: 3
  train_batch_size: 4
  sample_length: 8
  trackers: [jsonl]
  checkpoint: {save_every_steps: 1, async: false}
)");
  const TinyRun run = test::train_in(config, dir.path() / "soap");
  EXPECT_EQ(run.summary.steps, 3);
  EXPECT_TRUE(std::isfinite(run.summary.final_train_loss));
  EXPECT_TRUE(fs::exists(dir.path() / "soap" / "checkpoints" / "step-3"));
}

}  // namespace
}  // namespace loom
