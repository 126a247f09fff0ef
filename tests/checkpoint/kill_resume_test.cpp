// `loom train` as a scheduler treats it: killed with SIGKILL at random points (some of them inside
// a checkpoint write, slowed down by LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS so that a kill can land
// there) and started again with the same command, it must end with final weights byte-identical
// to the uninterrupted run's and the same metrics. SIGTERM saves and exits with 143; a second
// SIGINT stops at once. And `loom checkpoints` lists what a run left.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "../core/test_support.hpp"
#include "checkpoint/durable_io.hpp"

extern char** environ;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace loom {
namespace {

const char* config_text = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 2, num_heads: 2, attention: flash, resid_pdrop: 0.1}
tokenizer: byte
data: {type: synthetic, num_documents: 400}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 10}
trainer:
  num_train_steps: 400
  train_batch_size: 4
  log_every: 3
  steps_per_eval: 50
  max_eval_batches: 2
  sample_length: 16
  peak_flops: 1.0e9
  run_id: kill
  trackers: [jsonl]
  checkpoint: {save_every_steps: 10, keep_last: 2}
)";

pid_t spawn_loom(const fs::path& config, const fs::path& run_dir, const fs::path& log,
                 const std::vector<std::string>& extra, const std::string& env = "") {
  std::vector<std::string> argv = {LOOM_BINARY, "train", config.string(), "trainer.run_dir=" + run_dir.string()};
  argv.insert(argv.end(), extra.begin(), extra.end());
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::vector<std::string> environment;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS=", 0) != 0) environment.emplace_back(*e);
  if (!env.empty()) environment.push_back(env);
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (auto& e : environment) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0].c_str(), &actions, nullptr, args.data(), envp.data()) != 0)
    throw std::runtime_error("cannot start loom");
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

// Whether `pid` has exited (reaping it into `status`).
bool exited(pid_t pid, int& status) {
  return ::waitpid(pid, &status, WNOHANG) == pid;
}

bool write_in_progress(const fs::path& checkpoints) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(checkpoints, ec))
    if (e.path().filename().string().rfind(".tmp-step-", 0) == 0) return true;
  return false;
}

// The step of the last complete record in the run's metrics.
std::int64_t last_logged_step(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::int64_t step = -1;
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line, nullptr, false);
    if (r.is_object() && r.contains("step")) step = r["step"].get<std::int64_t>();
  }
  return step;
}

std::vector<std::string> losses(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    const auto r = nlohmann::json::parse(line);
    std::string s = "step " + std::to_string(r["step"].get<int>());
    for (const char* key : {"train/loss", "train/grad_norm", "eval/loss", "sample"})
      if (r.contains(key)) s += std::string(" ") + key + "=" + r[key].dump();
    out.push_back(s);
  }
  return out;
}

class KillResume : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = tmp_.write("kill.yaml", config_text);
    const auto t0 = Clock::now();
    const pid_t pid = spawn_loom(config_, reference(), tmp_.path() / "reference.log", {});
    const int status = wait_for(pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << checkpoint::read_whole(tmp_.path() / "reference.log");
    reference_seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  fs::path reference() const { return tmp_.path() / "reference"; }
  void expect_same_as_reference(const fs::path& run) const {
    EXPECT_EQ(checkpoint::read_whole(run / "model.safetensors"),
              checkpoint::read_whole(reference() / "model.safetensors"))
        << "the final weights differ from the uninterrupted run's";
    EXPECT_EQ(losses(run), losses(reference()));
  }

  test::TempDir tmp_;
  fs::path config_;
  double reference_seconds_ = 0;
};

TEST_F(KillResume, KilledAtRandomPointsAndResumedEndsByteIdentical) {
  const fs::path run = tmp_.path() / "run", log = tmp_.path() / "run.log";
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  std::cout << "kill points drawn with seed " << seed << " (reference run " << reference_seconds_ << " s)\n";
  int kills = 0, in_write = 0;
  for (int attempt = 0; attempt < 6; ++attempt) {
    // Even attempts: a random point of the run. Odd ones: inside a checkpoint write, each of
    // whose stages is slowed to 20 ms, at a random delay after its temporary directory appears.
    const bool during_write = attempt % 2 == 1;
    const std::int64_t logged = std::min<std::int64_t>(last_logged_step(run), 390);
    const pid_t pid = spawn_loom(config_, run, log, {}, during_write ? "LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS=20" : "");
    int status = 0;
    bool done = false;
    if (during_write) {
      const auto deadline = Clock::now() + std::chrono::seconds(20);
      while (!(done = exited(pid, status)) && !write_in_progress(run / "checkpoints") && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      // The first at once (certainly inside the write), the others anywhere in it or just after.
      if (!done && attempt > 1)
        std::this_thread::sleep_for(std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 80)(rng)));
      in_write += !done && write_in_progress(run / "checkpoints");
    } else {
      // A random point of what is left of the run (it resumes from its latest checkpoint): once
      // it has logged a random step, after a random delay of up to 5 ms. Progress, not wall time,
      // so that a slow or busy machine moves the points with it.
      // (The metrics file still holds what the previous attempt logged past its checkpoint until
      // the run starts its trackers: the target lies beyond that.)
      const std::int64_t target = std::uniform_int_distribution<std::int64_t>(logged + 1, 395)(rng);
      const auto deadline = Clock::now() + std::chrono::seconds(30);
      while (!(done = exited(pid, status)) && last_logged_step(run) < target && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      if (!done)
        std::this_thread::sleep_for(std::chrono::microseconds(std::uniform_int_distribution<int>(0, 5000)(rng)));
    }
    if (done) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << checkpoint::read_whole(log);
      std::cout << "attempt " << attempt << ": the run finished before the kill\n";
      break;
    }
    ::kill(pid, SIGKILL);
    status = wait_for(pid);
    if (WIFEXITED(status)) {  // it finished just before the kill
      ASSERT_EQ(WEXITSTATUS(status), 0) << checkpoint::read_whole(log);
      break;
    }
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    ++kills;
  }
  std::cout << kills << " kills, " << in_write << " of them inside a checkpoint write\n";
  EXPECT_GE(kills, 2);
  EXPECT_GE(in_write, 1);
  const pid_t last = spawn_loom(config_, run, log, {});
  const int status = wait_for(last);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << checkpoint::read_whole(log);
  expect_same_as_reference(run);
}

// Waits until the run has logged a step (its metrics file has a line).
void wait_for_progress(const fs::path& run, pid_t pid) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline) {
    std::ifstream in(run / "metrics.jsonl");
    std::string line;
    if (std::getline(in, line) && !line.empty()) return;
    int status = 0;
    if (exited(pid, status)) FAIL() << "the run ended before it logged a step";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  FAIL() << "the run logged nothing";
}

TEST_F(KillResume, SigtermSavesACheckpointAndExitsWith143) {
  const fs::path run = tmp_.path() / "run", log = tmp_.path() / "run.log";
  const pid_t pid = spawn_loom(config_, run, log, {});
  wait_for_progress(run, pid);
  ::kill(pid, SIGTERM);
  const int status = wait_for(pid);
  const std::string text = checkpoint::read_whole(log);
  // The signal comes at step 3 of 400: a run that ends with status 0 (or the default action's
  // death by SIGTERM) did not handle it.
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << ": SIGTERM was not handled\n" << text;
  EXPECT_EQ(WEXITSTATUS(status), 143) << text;
  EXPECT_NE(text.find("loom: SIGTERM: saving a checkpoint at the end of this step"), std::string::npos) << text;
  const auto at = text.find("stopped by SIGTERM after step ");
  ASSERT_NE(at, std::string::npos) << text;
  const int step = std::stoi(text.substr(at + 30));
  EXPECT_LT(step, 400) << text;
  EXPECT_EQ(checkpoint::read_whole(run / "checkpoints" / "latest"), "step-" + std::to_string(step) + "\n");
  EXPECT_FALSE(fs::exists(run / "model.safetensors"));
  // end.json records the stop.
  auto read_end = [&] { return nlohmann::json::parse(checkpoint::read_whole(run / "end.json"), nullptr, false); };
  nlohmann::json end = read_end();
  EXPECT_EQ(end["status"], "stopped") << end.dump();
  EXPECT_EQ(end["step"], step);
  EXPECT_EQ(end["reason"], "SIGTERM");

  // While the resumed run trains, there is no record of an end (killed, it leaves none).
  const pid_t resumed = spawn_loom(config_, run, log, {});
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  std::int64_t logged = 0;
  int resumed_status = 0;
  while (logged <= step && Clock::now() < deadline && !exited(resumed, resumed_status)) {
    std::ifstream in(run / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto r = nlohmann::json::parse(line, nullptr, false);
      if (r.is_object() && r.contains("step") && r["step"].is_number_integer())
        logged = std::max(logged, r["step"].get<std::int64_t>());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ::kill(resumed, SIGKILL);
  wait_for(resumed);
  ASSERT_GT(logged, step) << "the resumed run logged no step\n" << checkpoint::read_whole(log);
  EXPECT_FALSE(fs::exists(run / "end.json")) << read_end().dump();

  const pid_t again = spawn_loom(config_, run, log, {});
  const int status2 = wait_for(again);
  ASSERT_TRUE(WIFEXITED(status2) && WEXITSTATUS(status2) == 0) << checkpoint::read_whole(log);
  EXPECT_NE(checkpoint::read_whole(log).find("resumed from checkpoint "), std::string::npos);
  expect_same_as_reference(run);
  end = read_end();
  EXPECT_EQ(end["status"], "finished") << end.dump();
  EXPECT_EQ(end["step"], 400);
}

TEST_F(KillResume, ASecondSigintStopsAtOnce) {
  const fs::path run = tmp_.path() / "run", log = tmp_.path() / "run.log";
  // Each stage of the checkpoint write takes 5 s: the first SIGINT's save is still running when
  // the second arrives.
  const pid_t pid = spawn_loom(config_, run, log, {"trainer.checkpoint.save_every_steps=0"},
                               "LOOM_TEST_CHECKPOINT_STAGE_DELAY_MS=5000");
  wait_for_progress(run, pid);
  ::kill(pid, SIGINT);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int status = 0;
  bool done = false;
  while (!(done = exited(pid, status)) && !write_in_progress(run / "checkpoints") && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_FALSE(done) << checkpoint::read_whole(log);
  const auto sent = Clock::now();
  ::kill(pid, SIGINT);
  status = wait_for(pid);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - sent).count(), 4.0)
      << "the second SIGINT did not stop the run";
  ASSERT_TRUE(WIFSIGNALED(status)) << checkpoint::read_whole(log);
  EXPECT_EQ(WTERMSIG(status), SIGINT);
  const std::string text = checkpoint::read_whole(log);
  EXPECT_NE(text.find("loom: SIGINT: saving a checkpoint at the end of this step, then stopping (press Ctrl-C again "
                      "to stop at once)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("loom: second SIGINT: stopping now, without a checkpoint"), std::string::npos) << text;
  EXPECT_FALSE(fs::exists(run / "checkpoints" / "latest"));

  // The same command starts the run again (it had no checkpoint) and ends as the reference.
  const pid_t again = spawn_loom(config_, run, log, {});
  const int status2 = wait_for(again);
  ASSERT_TRUE(WIFEXITED(status2) && WEXITSTATUS(status2) == 0) << checkpoint::read_whole(log);
  expect_same_as_reference(run);
}

TEST_F(KillResume, CheckpointsCommandListsAndVerifies) {
  auto result = test::run_command({LOOM_BINARY, "checkpoints", reference().string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("checkpoints in " + (reference() / "checkpoints").string()), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("step-390"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("yes  (latest)"), std::string::npos) << result.out;
  fs::resize_file(reference() / "checkpoints" / "step-390" / "model.safetensors", 10);
  result = test::run_command({LOOM_BINARY, "checkpoints", (reference() / "checkpoints").string()});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("NO: model.safetensors is truncated: 10 bytes"), std::string::npos) << result.out;
  result = test::run_command({LOOM_BINARY, "checkpoints", tmp_.path().string()});
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("has no checkpoints"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace loom
