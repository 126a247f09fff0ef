// Trainer::add_hook: a caller's hooks between the steps of a run, at their intervals, with the
// step's figures; where they run among the run's own hooks (after the step's logging and before
// the stop-signal check and the checkpoint policy); a signal a hook raises stops the run after
// that very step with a checkpoint from which it resumes exactly; a hook's exception ends the run.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../core/test_support.hpp"
#include "checkpoint/durable_io.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/trainer.hpp"
#include "train_test_support.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

const char* hooks_config = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash, resid_pdrop: 0.1}
tokenizer: byte
data: {type: synthetic, num_documents: 400}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 2}
trainer:
  num_train_steps: 7
  train_batch_size: 4
  log_every: 1
  steps_per_eval: 3
  max_eval_batches: 2
  sample_length: 0
  peak_flops: 1.0e9
  trackers: [jsonl]
)";

// Trains hooks_config with `overrides` in dir/name, with the hooks `add` adds.
test::TrainedRun train_with(const test::TempDir& dir, const std::string& name, std::vector<std::string> overrides,
                            const std::function<void(Trainer&)>& add = {}) {
  const fs::path run_dir = dir.path() / name;
  overrides.push_back("trainer.run_dir=" + run_dir.string());
  overrides.push_back("trainer.run_id=" + name);
  RuntimeOptions options;
  options.config = dir.write(name + ".yaml", hooks_config);
  options.overrides = std::move(overrides);
  Runtime runtime(options);
  std::ostringstream out;
  TrainOptions train_options;
  train_options.out = &out;
  Trainer trainer(runtime, train_options);
  if (add) add(trainer);
  test::TrainedRun run;
  run.dir = run_dir;
  try {
    run.summary = trainer.train();
  } catch (...) {
    ADD_FAILURE() << out.str();
    throw;
  }
  run.log = out.str();
  return run;
}

nlohmann::json read_end(const fs::path& run_dir) {
  return nlohmann::json::parse(checkpoint::read_whole(run_dir / "end.json"), nullptr, false);
}

TEST(TrainerHooks, RunAtTheirIntervalsWithTheStepsFigures) {
  test::TempDir dir;
  std::vector<StepInfo> every_step, every_third;
  const auto run = train_with(dir, "a", {}, [&](Trainer& t) {
    t.add_hook([&](const StepInfo& s) { every_step.push_back(s); });
    t.add_hook([&](const StepInfo& s) { every_third.push_back(s); }, 3);
  });
  ASSERT_EQ(every_step.size(), 7u);
  ASSERT_EQ(every_third.size(), 2u);
  EXPECT_EQ(every_third[0].step, 3);
  EXPECT_EQ(every_third[1].step, 6);
  // With a log line per step the metrics hold each step's own loss and learning rate.
  std::vector<nlohmann::json> train_records;
  for (const auto& r : test::read_metrics(run.dir))
    if (r.contains("train/loss")) train_records.push_back(r);
  ASSERT_EQ(train_records.size(), 7u);
  for (std::size_t i = 0; i < every_step.size(); ++i) {
    const StepInfo& s = every_step[i];
    EXPECT_EQ(s.step, static_cast<std::int64_t>(i + 1));
    EXPECT_EQ(s.num_steps, 7);
    EXPECT_EQ(train_records[i]["step"], s.step);
    EXPECT_EQ(train_records[i]["train/loss"].get<double>(), s.loss) << "step " << s.step;
    EXPECT_EQ(train_records[i]["train/lr"].get<double>(), s.lr) << "step " << s.step;
    EXPECT_EQ(train_records[i]["train/grad_norm"].get<double>(), s.grad_norm) << "step " << s.step;
    EXPECT_FALSE(s.skipped);
    EXPECT_TRUE(s.metrics.empty());  // causal_lm has no metrics of its own
    EXPECT_EQ(s.rank, 0);
    EXPECT_EQ(s.ranks, 1);
    EXPECT_EQ(fs::path(s.run_dir), run.dir);
    EXPECT_EQ(fs::path(s.checkpoint_dir), run.dir / "checkpoints");
  }
  EXPECT_EQ(every_third[1].loss, every_step[5].loss);
  // The hooks of the caller leave the run as it was: the same weights as a run without them.
  const auto plain = train_with(dir, "b", {});
  EXPECT_EQ(test::all_weights(run.dir / "model.safetensors"), test::all_weights(plain.dir / "model.safetensors"));
}

// A hook runs before the checkpoint policy saves its step: it sees the checkpoint of an earlier
// step, committed (trainer.checkpoint.async: false).
TEST(TrainerHooks, RunBeforeTheCheckpointPolicySavesTheirStep) {
  test::TempDir dir;
  std::vector<std::int64_t> seen;
  train_with(dir, "a", {"trainer.checkpoint.save_every_steps=2", "trainer.checkpoint.async=false"}, [&](Trainer& t) {
    t.add_hook([&](const StepInfo& s) {
      seen.push_back(s.last_checkpoint_step);
      if (s.last_checkpoint_step > 0) {
        EXPECT_EQ(checkpoint::read_whole(fs::path(s.checkpoint_dir) / "latest"),
                  "step-" + std::to_string(s.last_checkpoint_step) + "\n")
            << "step " << s.step;
      }
    });
  });
  EXPECT_EQ(seen, (std::vector<std::int64_t>{-1, -1, 2, 2, 4, 4, 6}));
}

// A hook acts between steps: SIGTERM raised after step 4 stops the run after step 4, with a
// checkpoint of it, as a scheduler's SIGTERM would at the next step boundary; the same command
// then resumes from it and ends with the uninterrupted run's weights, bit for bit.
TEST(TrainerHooks, ASignalRaisedByAHookStopsTheRunAfterThatStep) {
  test::TempDir dir;
  std::vector<std::int64_t> steps;
  const auto stopped = train_with(dir, "a", {"trainer.num_train_steps=10"}, [&](Trainer& t) {
    t.add_hook([&](const StepInfo& s) {
      steps.push_back(s.step);
      if (s.step == 4) std::raise(SIGTERM);
    });
  });
  EXPECT_EQ(steps, (std::vector<std::int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(stopped.summary.stopped_by_signal, SIGTERM);
  EXPECT_EQ(stopped.summary.steps, 4);
  EXPECT_NE(stopped.log.find("stopped by SIGTERM after step 4 of 10; checkpoint " +
                             (stopped.dir / "checkpoints" / "step-4").string() + " holds it"),
            std::string::npos)
      << stopped.log;
  EXPECT_EQ(checkpoint::read_whole(stopped.dir / "checkpoints" / "latest"), "step-4\n");
  EXPECT_FALSE(fs::exists(stopped.dir / "model.safetensors"));
  nlohmann::json end = read_end(stopped.dir);
  EXPECT_EQ(end["status"], "stopped") << end.dump();
  EXPECT_EQ(end["step"], 4);
  EXPECT_EQ(end["reason"], "SIGTERM");

  std::vector<std::int64_t> resumed_steps;
  const auto resumed = train_with(dir, "a", {"trainer.num_train_steps=10"}, [&](Trainer& t) {
    t.add_hook([&](const StepInfo& s) { resumed_steps.push_back(s.step); }, 2);
  });
  EXPECT_EQ(resumed.summary.resumed_from_step, 4);
  EXPECT_EQ(resumed_steps, (std::vector<std::int64_t>{6, 8, 10}));
  const auto uninterrupted = train_with(dir, "b", {"trainer.num_train_steps=10"});
  EXPECT_EQ(test::all_weights(resumed.dir / "model.safetensors"),
            test::all_weights(uninterrupted.dir / "model.safetensors"));
  end = read_end(resumed.dir);
  EXPECT_EQ(end["status"], "finished") << end.dump();
}

TEST(TrainerHooks, AHooksExceptionEndsTheRunWithIt) {
  test::TempDir dir;
  const fs::path config = dir.write("a.yaml", hooks_config);
  RuntimeOptions options;
  options.config = config;
  options.overrides = {"trainer.run_dir=" + (dir.path() / "a").string(), "trainer.run_id=a"};
  Runtime runtime(options);
  std::ostringstream out;
  TrainOptions train_options;
  train_options.out = &out;
  Trainer trainer(runtime, train_options);
  int calls = 0;
  trainer.add_hook([&](const StepInfo& s) {
    ++calls;
    if (s.step == 2) throw UserError("the hook's own error at step 2");
  });
  try {
    trainer.train();
    FAIL() << "expected the hook's error";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "the hook's own error at step 2");
  }
  EXPECT_EQ(calls, 2);
  const nlohmann::json end = read_end(dir.path() / "a");
  EXPECT_EQ(end["status"], "error") << end.dump();
  EXPECT_EQ(end["step"], 2);
  EXPECT_EQ(end["message"], "the hook's own error at step 2");
}

TEST(TrainerHooks, AnIntervalBelowOneIsRefused) {
  test::TempDir dir;
  RuntimeOptions options;
  options.config = dir.write("a.yaml", hooks_config);
  Runtime runtime(options);
  Trainer trainer(runtime);
  EXPECT_THROW(trainer.add_hook([](const StepInfo&) {}, 0), InternalError);
  EXPECT_THROW(trainer.add_hook(TrainHook(), 1), InternalError);
}

}  // namespace
}  // namespace loom
