// Parts of the run layer a user meets directly: the step line's MFU (never above 100% without
// saying the roof is too low) and the run directory's lock (held by every rank of a run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <string>

#include "../core/test_support.hpp"
#include "loom/error.hpp"
#include "train/progress.hpp"
#include "train/run_directory.hpp"

namespace loom::training {
namespace {

namespace fs = std::filesystem;

std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST(Progress, AnMfuAboveOneHundredPercentSaysTheRoofIsTooLow) {
  std::ostringstream out;
  ProgressPrinter progress(out, /*interactive=*/false);
  RunHeader header;
  header.peak_flops = 443e9;
  header.peak_flops_probed = true;
  progress.header(header);
  StepReport report;
  report.num_steps = 3;
  report.step = 1;
  report.mfu = 0.5;
  progress.step(report);
  EXPECT_NE(out.str().find("MFU 50.0%  ETA"), std::string::npos) << out.str();
  EXPECT_EQ(out.str().find("warning"), std::string::npos) << out.str();
  const std::string before = out.str();
  report.step = 2;
  report.mfu = 1.169;
  progress.step(report);
  report.step = 3;
  progress.step(report);
  const std::string after = out.str().substr(before.size());
  EXPECT_EQ(occurrences(after, "MFU 116.9% (above the roof: too low)  ETA"), 2u) << after;
  // Once: what is wrong and what to do.
  EXPECT_EQ(occurrences(after,
                        "warning: MFU 116.9%: the run computes 517.9 GFLOP/s, above the roof of 443.0 GFLOP/s "
                        "it is measured against, which the start-up GEMM probe measured low"),
            1u)
      << after;
  EXPECT_EQ(occurrences(after, "set trainer.peak_flops"), 1u) << after;
  progress.done(3, 10, 1000, 1.169, 1 << 20, 1, "runs/x");
  EXPECT_NE(out.str().find("MFU 116.9% (above the roof: too low), peak memory"), std::string::npos) << out.str();
  EXPECT_EQ(format_mfu(1.0), "100.0%");
}

// What a config's trainer section holds for RunDirectory::open: just the run directory.
Options trainer_options(const fs::path& dir) {
  Value v = Value::map();
  v.set("run_id", Value(std::string("locked")));
  v.set("run_dir", Value(dir.string()));
  return Options(v, "trainer");
}

// flock's locks belong to an open file: two opens in one process contend as two processes do, so
// one process can play the ranks of a run and a second run.
TEST(RunDirectoryLock, ASecondRunIsRefusedWhileAnyRankOfTheFirstHoldsIt) {
  test::TempDir tmp;
  const fs::path dir = tmp.path() / "run";
  const Options trainer = trainer_options(dir);
  auto rank0 = std::make_unique<RunDirectory>(RunDirectory::open(trainer, Value::map(), {}));
  RunDirectory rank1;
  rank1.share_lock(dir);
  try {
    RunDirectory::open(trainer, Value::map());
    FAIL() << "a second run opened a directory the first holds";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("run directory '" + dir.string() +
                                         "' is in use: another loom run is "
                                         "training in it (pid " +
                                         std::to_string(::getpid()) + " holds " + (dir / ".lock").string() +
                                         ": its ranks on this host)"),
              std::string::npos)
        << e.what();
  }
  // Rank 0 gone, rank 1 still there: still refused.
  rank0.reset();
  EXPECT_THROW(RunDirectory::open(trainer, Value::map()), UserError);
  // Every rank gone: the next run opens it.
  rank1 = RunDirectory();
  EXPECT_NO_THROW(RunDirectory::open(trainer, Value::map()));
}

}  // namespace
}  // namespace loom::training
