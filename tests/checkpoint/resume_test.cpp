// trainer.resume in-process: a run resumed from any checkpoint ends with the same weights, byte
// for byte, and the same metrics as the run never interrupted; the refusals name what differs;
// corrupt checkpoints are passed over (auto) or refused (an explicit path).
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/test_support.hpp"
#include "checkpoint/durable_io.hpp"
#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/run/trainer.hpp"
#include "train/checkpointing.hpp"

namespace fs = std::filesystem;

namespace loom {
namespace {

// Dropout (the dropout stream), micro-batches, the skip rule's window, a log interval (3) that
// checkpoints (every 4) fall inside, evaluations and samples: everything a resume must restore.
const char* config_text = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash, resid_pdrop: 0.1}
tokenizer: byte
data: {type: synthetic, num_documents: 400}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 2}
trainer:
  num_train_steps: 20
  train_batch_size: 4
  microbatch_size: 2
  log_every: 3
  steps_per_eval: 5
  max_eval_batches: 2
  sample_every: 10
  sample_length: 8
  skip_bad_steps: true
  skip_step_window: 4
  peak_flops: 1.0e15  # far above this tiny run, so no MFU-above-the-roof warning
  run_id: tiny
  trackers: [jsonl, tensorboard]
  checkpoint: {save_every_steps: 4, keep_last: 10}
)";

struct Result {
  TrainSummary summary;
  std::string log;
};

Result train_in(const test::TempDir& tmp, const fs::path& run_dir, std::vector<std::string> overrides = {}) {
  const fs::path file = tmp.path() / "run.yaml";
  if (!fs::exists(file)) tmp.write("run.yaml", config_text);
  overrides.push_back("trainer.run_dir=" + run_dir.string());
  RuntimeOptions options;
  options.config = file;
  options.overrides = overrides;
  Runtime runtime(options);
  std::ostringstream out;
  TrainOptions train_options;
  train_options.out = &out;
  Result r{train(runtime, train_options), ""};
  r.log = out.str();
  return r;
}

std::string bytes_of(const fs::path& file) {
  return checkpoint::read_whole(file);
}

// Every record's step and losses, as the uninterrupted run must have them.
std::vector<std::string> losses(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    std::string s = "step " + std::to_string(r["step"].get<int>());
    for (const char* key : {"train/loss", "train/grad_norm", "train/lr", "train/skipped_steps", "eval/loss", "sample"})
      if (r.contains(key)) s += std::string(" ") + key + "=" + r[key].dump();
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> losses_after(const fs::path& run_dir, int step) {
  std::vector<std::string> out;
  for (const auto& l : losses(run_dir))
    if (std::stoi(l.substr(5)) > step) out.push_back(l);
  return out;
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const UserError& e) {
    for (const auto& w : words)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << "'" << w << "' in\n" << e.what();
  }
}

TEST(Resume, FromAnyCheckpointEndsByteIdentical) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full";
  const Result uninterrupted = train_in(tmp, full);
  EXPECT_EQ(uninterrupted.summary.resumed_from_step, -1);
  for (int step : {4, 8, 12, 16}) {
    SCOPED_TRACE("resumed at step " + std::to_string(step));
    // Continued in a fresh directory from the uninterrupted run's checkpoint.
    const fs::path dir = tmp.path() / ("from-" + std::to_string(step));
    const fs::path checkpoint = full / "checkpoints" / ("step-" + std::to_string(step));
    const Result resumed = train_in(tmp, dir, {"trainer.resume=" + checkpoint.string()});
    EXPECT_EQ(resumed.summary.resumed_from_step, step);
    EXPECT_NE(resumed.log.find("resumed from checkpoint " + checkpoint.string() + " at step " + std::to_string(step) +
                               " of 20"),
              std::string::npos)
        << resumed.log;
    EXPECT_EQ(resumed.log.find("warning"), std::string::npos) << resumed.log;
    EXPECT_EQ(bytes_of(dir / "model.safetensors"), bytes_of(full / "model.safetensors"));
    EXPECT_EQ(losses(dir), losses_after(full, step));
    EXPECT_EQ(resumed.summary.final_eval_loss, uninterrupted.summary.final_eval_loss);
    EXPECT_EQ(resumed.summary.final_sample, uninterrupted.summary.final_sample);
    // The final checkpoints agree too (state.json's clocks and time aside).
    for (const char* f : {"model.safetensors", "optimizer.safetensors"})
      EXPECT_EQ(bytes_of(dir / "checkpoints" / "step-20" / f), bytes_of(full / "checkpoints" / "step-20" / f)) << f;
  }
}

// With trainer.ema_decay the average lives in the checkpoints (ema/<parameter> in
// optimizer.safetensors) and a resumed run continues it: the final weights (the average, which
// the final save and the evaluations use) and the evaluation losses are those of the run never
// interrupted, byte for byte.
TEST(Resume, TheWeightAverageContinuesExactly) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full";
  const std::vector<std::string> ema{"trainer.ema_decay=0.9"};
  const Result uninterrupted = train_in(tmp, full, ema);
  const std::string average = bytes_of(full / "model.safetensors");
  // The average is what was saved: a run without it ends with other weights.
  train_in(tmp, tmp.path() / "plain");
  EXPECT_NE(bytes_of(tmp.path() / "plain" / "model.safetensors"), average);
  EXPECT_NE(bytes_of(full / "checkpoints" / "step-8" / "optimizer.safetensors").find("ema/"), std::string::npos);
  for (int step : {8, 12}) {
    SCOPED_TRACE("resumed at step " + std::to_string(step));
    const fs::path dir = tmp.path() / ("from-" + std::to_string(step));
    auto overrides = ema;
    overrides.push_back("trainer.resume=" + (full / "checkpoints" / ("step-" + std::to_string(step))).string());
    const Result resumed = train_in(tmp, dir, overrides);
    EXPECT_EQ(resumed.summary.resumed_from_step, step);
    EXPECT_EQ(bytes_of(dir / "model.safetensors"), average);
    EXPECT_EQ(losses(dir), losses_after(full, step));
    EXPECT_EQ(resumed.summary.final_eval_loss, uninterrupted.summary.final_eval_loss);
  }
}

// SGD with momentum keeps its state lazily (PyTorch's momentum buffer exists from a parameter's
// first update): a checkpoint holds buffers the freshly made optimizer does not have yet, and the
// resumed run takes them and continues byte for byte (it was refused as a state mismatch before).
TEST(Resume, ALazyOptimizerStateResumesExactly) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full";
  const std::vector<std::string> sgd{"optimizer.type=sgd", "optimizer.momentum=0.9", "optimizer.learning_rate=0.05"};
  train_in(tmp, full, sgd);
  EXPECT_NE(bytes_of(full / "checkpoints" / "step-8" / "optimizer.safetensors").find("momentum_buffer/"),
            std::string::npos);
  const fs::path dir = tmp.path() / "from-8";
  auto overrides = sgd;
  overrides.push_back("trainer.resume=" + (full / "checkpoints" / "step-8").string());
  const Result resumed = train_in(tmp, dir, overrides);
  EXPECT_EQ(resumed.summary.resumed_from_step, 8);
  EXPECT_EQ(bytes_of(dir / "model.safetensors"), bytes_of(full / "model.safetensors"));
  EXPECT_EQ(losses(dir), losses_after(full, 8));
}

// What a SIGKILL after step 14 leaves: checkpoints up to 12, metrics up to 14, no final weights.
void interrupt_after(const fs::path& dir, int checkpoint_step, int metrics_step) {
  fs::remove(dir / "model.safetensors");
  for (const auto& e : fs::directory_iterator(dir / "checkpoints")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && std::stoi(name.substr(5)) > checkpoint_step) fs::remove_all(e.path());
  }
  std::ofstream(dir / "checkpoints" / "latest") << "step-" << checkpoint_step << "\n";
  std::ifstream in(dir / "metrics.jsonl");
  std::string kept;
  for (std::string line; std::getline(in, line);)
    if (nlohmann::json::parse(line)["step"].get<int>() <= metrics_step) kept += line + "\n";
  kept += "{\"step\": 15, \"train/lo";  // a torn last line
  in.close();
  std::ofstream(dir / "metrics.jsonl") << kept;
}

TEST(Resume, AutoContinuesAnInterruptedRunAndItsMetrics) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full", run = tmp.path() / "run";
  train_in(tmp, full);
  fs::copy(full, run, fs::copy_options::recursive);
  interrupt_after(run, 12, 14);
  const Result resumed = train_in(tmp, run);
  EXPECT_EQ(resumed.summary.resumed_from_step, 12);
  EXPECT_EQ(bytes_of(run / "model.safetensors"), bytes_of(full / "model.safetensors"));
  EXPECT_EQ(losses(run), losses(full));  // records past 12 dropped and written again, once
}

TEST(Resume, AFinishedRunIsLeftAloneAndCanBeTrainedFurther) {
  test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  train_in(tmp, run);
  const std::string weights = bytes_of(run / "model.safetensors"), metrics = bytes_of(run / "metrics.jsonl");
  const Result again = train_in(tmp, run);
  EXPECT_TRUE(again.summary.already_finished);
  EXPECT_NE(again.log.find("finished at step 20"), std::string::npos) << again.log;
  EXPECT_EQ(bytes_of(run / "model.safetensors"), weights);
  EXPECT_EQ(bytes_of(run / "metrics.jsonl"), metrics);

  expect_error([&] { train_in(tmp, run, {"trainer.num_train_steps=10"}); },
               {"is at step 20, past trainer.num_train_steps (10)", "may raise num_train_steps"});

  const Result further = train_in(tmp, run, {"trainer.num_train_steps=30"});
  EXPECT_EQ(further.summary.resumed_from_step, 20);
  EXPECT_EQ(further.summary.steps, 30);
  EXPECT_NE(further.log.find("trainer.num_train_steps is 30 (the checkpoint's run had 20)"), std::string::npos)
      << further.log;
  EXPECT_NE(losses(run).back().find("step 30"), std::string::npos);
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-30"));
}

TEST(Resume, ChangesThatMakeTheCheckpointUnusableNameTheKeys) {
  test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  train_in(tmp, run);
  const std::string latest = bytes_of(run / "checkpoints" / "latest"), config = bytes_of(run / "config.yaml");
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.num_train_steps=30", "model.hidden_dim=64"});
      },
      {"cannot resume from '" + (run / "checkpoints" / "step-20").string() + "'",
       "the model's shape differs from the checkpoint's", "model.hidden_dim (32 in the checkpoint, 64 now)"});
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.num_train_steps=30", "model.num_layers=3"});
      },
      {"'h.2.ln_1.weight' is not in the checkpoint", "model.num_layers (2 in the checkpoint, 3 now)"});
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.num_train_steps=30", "optimizer.type=lion"});
      },
      {"optimizer.type (adamw in the checkpoint, lion now)"});
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.num_train_steps=30", "tokenizer=char"});
      },
      {"the tokenizer's vocabulary differs from the checkpoint's (256 tokens there",
       "tokenizer.type (byte in the checkpoint, char now)"});
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.resume=" + (run / "checkpoints" / "step-16").string(), "model.hidden_dim=64"});
      },
      {"the model's shape differs"});
  // Nothing was touched: not the checkpoints past an explicit one either.
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-20"));
  EXPECT_EQ(bytes_of(run / "checkpoints" / "latest"), latest);
  EXPECT_EQ(bytes_of(run / "config.yaml"), config);
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "step-24"));

  // Other changes continue the run, and say what changed.
  const Result changed = train_in(tmp, run, {"trainer.num_train_steps=24", "optimizer.learning_rate=0.001"});
  EXPECT_NE(changed.log.find("options changed since the checkpoint"), std::string::npos) << changed.log;
  EXPECT_NE(changed.log.find("optimizer.learning_rate (0.003 in the checkpoint, 0.001 now)"), std::string::npos)
      << changed.log;
}

TEST(Resume, NeverRefusesADirectoryThatHoldsARun) {
  test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  train_in(tmp, run, {"trainer.num_train_steps=4"});
  expect_error(
      [&] {
        train_in(tmp, run, {"trainer.resume=never", "trainer.num_train_steps=8"});
      },
      {"already holds a run and trainer.resume is `never`"});
  // Without checkpoints, a finished run is refused under auto as well.
  const fs::path plain = tmp.path() / "plain";
  train_in(tmp, plain, {"trainer.num_train_steps=4", "trainer.checkpoint.save_every_steps=0"});
  EXPECT_FALSE(fs::exists(plain / "checkpoints" / "latest"));
  expect_error([&] { train_in(tmp, plain, {"trainer.num_train_steps=8"}); }, {"already holds a run, finished"});
}

TEST(Resume, ACorruptCheckpointIsPassedOverUnderAutoAndRefusedWhenNamed) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full", run = tmp.path() / "run";
  train_in(tmp, full);
  fs::copy(full, run, fs::copy_options::recursive);
  const fs::path bad = run / "checkpoints" / "step-20" / "optimizer.safetensors";
  {
    std::fstream f(bad, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  expect_error([&] { train_in(tmp, tmp.path() / "other", {"trainer.resume=" + (run / "checkpoints").string()}); },
               {"'" + bad.string() + "' fails its CRC-32C check", "nothing was loaded"});
  const Result resumed = train_in(tmp, run);
  EXPECT_NE(resumed.log.find("warning: checkpoint " + (run / "checkpoints" / "step-20").string() + " is unusable: '" +
                             bad.string() + "' fails its CRC-32C check"),
            std::string::npos)
      << resumed.log;
  EXPECT_NE(resumed.log.find("resuming from the previous valid checkpoint"), std::string::npos) << resumed.log;
  EXPECT_EQ(resumed.summary.resumed_from_step, 16);
  EXPECT_EQ(bytes_of(run / "model.safetensors"), bytes_of(full / "model.safetensors"));
  EXPECT_EQ(losses(run), losses(full));
  EXPECT_EQ(bytes_of(run / "checkpoints" / "step-20" / "optimizer.safetensors"),
            bytes_of(full / "checkpoints" / "step-20" / "optimizer.safetensors"));
}

void flip_a_byte(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-5, std::ios::end);
  const char c = static_cast<char>(f.get());
  f.seekp(-5, std::ios::end);
  f.put(static_cast<char>(c ^ 0x10));
}

// A resume that finds checkpoints and none that verifies refuses, naming each, and touches
// nothing; trainer.resume=never then starts over and moves them aside, deleting none.
TEST(Resume, NoValidCheckpointIsARefusalAndNeverMovesThemAside) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full", run = tmp.path() / "run";
  train_in(tmp, full);
  fs::copy(full, run, fs::copy_options::recursive);
  interrupt_after(run, 20, 20);
  std::vector<int> steps{4, 8, 12, 16, 20};
  std::map<int, std::string> damaged;
  for (int step : steps) {
    const fs::path weights = run / "checkpoints" / ("step-" + std::to_string(step)) / "model.safetensors";
    flip_a_byte(weights);
    damaged[step] = bytes_of(weights);
  }
  const std::string metrics = bytes_of(run / "metrics.jsonl");
  std::vector<std::string> words{"has checkpoints in " + (run / "checkpoints").string(),
                                 "none of them can be resumed from", "trainer.resume=never", "not deleted"};
  for (int step : steps)
    words.push_back("checkpoint " + (run / "checkpoints" / ("step-" + std::to_string(step))).string() +
                    " is unusable: '" +
                    (run / "checkpoints" / ("step-" + std::to_string(step)) / "model.safetensors").string() +
                    "' fails its CRC-32C check");
  expect_error([&] { train_in(tmp, run); }, words);
  // Nothing was changed: every checkpoint, `latest` and the metrics are as they were.
  for (int step : steps)
    EXPECT_EQ(bytes_of(run / "checkpoints" / ("step-" + std::to_string(step)) / "model.safetensors"), damaged[step]);
  EXPECT_EQ(bytes_of(run / "checkpoints" / "latest"), "step-20\n");
  EXPECT_EQ(bytes_of(run / "metrics.jsonl"), metrics);

  const Result fresh = train_in(tmp, run, {"trainer.resume=never"});
  EXPECT_EQ(fresh.summary.resumed_from_step, -1);
  EXPECT_EQ(bytes_of(run / "model.safetensors"), bytes_of(full / "model.safetensors"));
  EXPECT_EQ(losses(run), losses(full));
  // The old ones are beside the new ones, as they were.
  std::map<int, fs::path> aside;
  for (const auto& e : fs::directory_iterator(run / "checkpoints")) {
    const std::string name = e.path().filename().string();
    if (const auto at = name.find(".unusable-"); at != std::string::npos) aside[std::stoi(name.substr(5, at - 5))] = e;
  }
  ASSERT_EQ(aside.size(), steps.size()) << fresh.log;
  for (int step : steps) {
    EXPECT_EQ(bytes_of(aside[step] / "model.safetensors"), damaged[step]);
    EXPECT_NE(fresh.log.find("warning: checkpoint " +
                             (run / "checkpoints" / ("step-" + std::to_string(step))).string() + " is unusable ("),
              std::string::npos)
        << fresh.log;
    EXPECT_NE(fresh.log.find("moved it aside to " + aside[step].string()), std::string::npos) << fresh.log;
  }
  EXPECT_TRUE(fs::exists(run / "checkpoints" / "step-20" / "manifest.json"));  // the new run's own
  // A directory whose checkpoint verifies is still refused under never.
  interrupt_after(run, 16, 16);
  expect_error([&] { train_in(tmp, run, {"trainer.resume=never"}); },
               {"already holds a run and trainer.resume is `never`", "step-16 verifies"});
}

TEST(Resume, InitFromIsIgnoredWhenTheRunResumes) {
  test::TempDir tmp;
  const fs::path run = tmp.path() / "run";
  train_in(tmp, run);
  const Result further = train_in(tmp, run, {"trainer.num_train_steps=24", "trainer.init_from=/no/such/weights"});
  EXPECT_NE(further.log.find("note: trainer.init_from is ignored: the run resumes from " +
                             (run / "checkpoints" / "step-20").string()),
            std::string::npos)
      << further.log;
}

TEST(Resume, ARunStoppedBeforeItsFirstCheckpointStartsAgain) {
  test::TempDir tmp;
  const fs::path full = tmp.path() / "full", run = tmp.path() / "run";
  train_in(tmp, full);
  fs::create_directories(run);
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 3, \"train/loss\": 9.0}\n{\"step\": 6, \"tra";
  const Result fresh = train_in(tmp, run);
  EXPECT_NE(fresh.log.find("starts again from step 0"), std::string::npos) << fresh.log;
  EXPECT_EQ(bytes_of(run / "model.safetensors"), bytes_of(full / "model.safetensors"));
  EXPECT_EQ(losses(run), losses(full));
}

TEST(CheckpointPolicy, StepsPermanentStepsAndMinutes) {
  using Clock = training::CheckpointPolicy::Clock;
  training::CheckpointSettings settings;
  settings.save_every_steps = 4;
  settings.retention.keep_every_steps = 10;
  settings.save_every_minutes = 0;
  const auto t0 = Clock::now();
  training::CheckpointPolicy steps(settings, t0);
  std::vector<std::int64_t> due;
  for (std::int64_t s = 1; s <= 20; ++s)
    if (steps.due(s, t0)) due.push_back(s);
  EXPECT_EQ(due, (std::vector<std::int64_t>{4, 8, 10, 12, 16, 20}));

  settings.save_every_steps = 0;
  settings.retention.keep_every_steps = 0;
  settings.save_every_minutes = 0.5;
  training::CheckpointPolicy minutes(settings, t0);
  EXPECT_FALSE(minutes.due(7, t0 + std::chrono::seconds(29)));
  EXPECT_TRUE(minutes.due(7, t0 + std::chrono::seconds(30)));
  minutes.saved(t0 + std::chrono::seconds(30));
  EXPECT_FALSE(minutes.due(8, t0 + std::chrono::seconds(45)));
  EXPECT_TRUE(minutes.due(9, t0 + std::chrono::seconds(61)));
}

}  // namespace
}  // namespace loom
