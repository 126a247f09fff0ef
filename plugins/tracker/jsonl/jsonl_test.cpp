// tracker `jsonl`, loaded through the plugin host: one JSON object per logged step in
// <run_dir>/metrics.jsonl, every line parsing on its own, and a resumed run dropping the records
// at or past its start step so no step appears twice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/plugin_host.hpp"
#include "loom/core/registry.hpp"
#include "loom/error.hpp"
#include "loom/kinds/tracker.hpp"

namespace {

namespace fs = std::filesystem;

// Loaded once and never unloaded: exceptions made by the plugin's code must not outlive it.
loom::Registry& registry() {
  static loom::Registry r;
  static const bool loaded = [] {
    loom::PluginHost host;
    host.load({{LOOM_PLUGIN_FILE, "test"}}, r);
    for (const auto& p : host.plugins()) EXPECT_EQ(p.status, loom::PluginRecord::Status::loaded) << p.reason;
    return true;
  }();
  (void)loaded;
  return r;
}

loom::Handle<loom::Tracker> jsonl() {
  return registry().create<loom::Tracker>({"tracker", "jsonl", loom::Value("jsonl"), "trainer.trackers"});
}

class JsonlTracker : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("loom-jsonl-test-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  loom::RunInfo run(std::int64_t start_step = 0) const {
    return {dir_.string(), "test-run", loom::Value(), start_step};
  }

  // Every line of metrics.jsonl, parsed (a line that does not parse fails the test).
  std::vector<nlohmann::ordered_json> records() const {
    std::ifstream in(dir_ / "metrics.jsonl");
    EXPECT_TRUE(in.good()) << "no metrics.jsonl in " << dir_;
    std::vector<nlohmann::ordered_json> out;
    std::string line;
    while (std::getline(in, line)) {
      try {
        out.push_back(nlohmann::ordered_json::parse(line));
      } catch (const std::exception& e) {
        ADD_FAILURE() << "line " << out.size() + 1 << " is not JSON (" << e.what() << "): " << line;
      }
    }
    return out;
  }

  std::vector<std::int64_t> steps() const {
    std::vector<std::int64_t> s;
    for (const auto& r : records()) s.push_back(r.at("step").get<std::int64_t>());
    return s;
  }

  fs::path dir_;
};

TEST_F(JsonlTracker, WritesOneObjectPerStepWithEverythingLoggedForIt) {
  auto t = jsonl();
  t->start(run());
  t->log_scalars(10, {{"train/loss", 2.5}, {"train/lr", 6e-4}, {"throughput/tokens_per_second", 12345.678}});
  t->log_scalars(10, {{"eval/loss", 2.75}});  // same step: the same object
  t->log_text(10, "sample", "ROMEO:\n\"Hark\" \\ \xc3\xa9");
  t->log_scalars(20, {{"train/loss", 0.1 + 0.2}, {"train/grad_norm", std::numeric_limits<double>::quiet_NaN()}});
  t->flush();

  const auto r = records();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].begin().key(), "step");  // the step comes first
  EXPECT_EQ(r[0]["step"], 10);
  EXPECT_EQ(r[0]["train/loss"].get<double>(), 2.5);
  EXPECT_EQ(r[0]["train/lr"].get<double>(), 6e-4);
  EXPECT_EQ(r[0]["throughput/tokens_per_second"].get<double>(), 12345.678);
  EXPECT_EQ(r[0]["eval/loss"].get<double>(), 2.75);
  EXPECT_EQ(r[0]["sample"].get<std::string>(), "ROMEO:\n\"Hark\" \\ \xc3\xa9");
  EXPECT_EQ(r[1]["step"], 20);
  EXPECT_EQ(r[1]["train/loss"].get<double>(), 0.1 + 0.2);  // doubles round-trip exactly
  EXPECT_TRUE(r[1]["train/grad_norm"].is_null());          // JSON has no NaN
}

TEST_F(JsonlTracker, ResumingDropsTheRecordsAtOrPastTheStartStep) {
  {
    auto t = jsonl();
    t->start(run());
    for (int step = 1; step <= 10; ++step) t->log_scalars(step, {{"train/loss", 10.0 - step}});
    t->flush();
  }
  // The previous process was killed in the middle of a line.
  std::ofstream(dir_ / "metrics.jsonl", std::ios::app) << "{\"step\": 11, \"train/lo";

  // Resumed from the checkpoint of step 6: steps 6.. are logged again.
  auto t = jsonl();
  t->start(run(6));
  for (int step = 6; step <= 8; ++step) t->log_scalars(step, {{"train/loss", 100.0 + step}});
  t->flush();
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8}));
  const auto r = records();
  EXPECT_EQ(r[4]["train/loss"].get<double>(), 5.0);    // kept from the first part
  EXPECT_EQ(r[5]["train/loss"].get<double>(), 106.0);  // written by the resumed part
}

TEST_F(JsonlTracker, AFreshRunInAnExistingDirectoryStartsTheFileAgain) {
  {
    auto t = jsonl();
    t->start(run());
    t->log_scalars(1, {{"train/loss", 1.0}});
    t->log_scalars(2, {{"train/loss", 2.0}});
  }
  auto t = jsonl();
  t->start(run(0));
  t->log_scalars(1, {{"train/loss", 3.0}});
  t->flush();
  const auto r = records();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0]["train/loss"].get<double>(), 3.0);
}

TEST_F(JsonlTracker, TheLastStepIsWrittenWhenTheTrackerEndsWithoutAFlush) {
  {
    auto t = jsonl();
    t->start(run());
    t->log_scalars(1, {{"train/loss", 1.0}});
    t->log_scalars(2, {{"train/loss", 2.0}});
  }
  EXPECT_EQ(steps(), (std::vector<std::int64_t>{1, 2}));
}

TEST_F(JsonlTracker, ARunDirectoryThatCannotBeWrittenIsAUserErrorNamingTheFile) {
  auto t = jsonl();
  loom::RunInfo info = run();
  info.run_dir = (dir_ / "missing" / "deeper").string();
  try {
    t->start(info);
    FAIL() << "expected a loom::UserError";
  } catch (const loom::UserError& e) {
    EXPECT_NE(std::string(e.what()).find((dir_ / "missing" / "deeper" / "metrics.jsonl").string()), std::string::npos)
        << e.what();
  }
}

TEST_F(JsonlTracker, LoggingBeforeStartIsABug) {
  auto t = jsonl();
  EXPECT_THROW(t->log_scalars(1, {{"train/loss", 1.0}}), loom::InternalError);
}

}  // namespace
