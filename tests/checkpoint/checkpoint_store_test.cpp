// The checkpoint store: its commit protocol under a crash at every stage (a forked child killed
// with SIGKILL), verification of corrupt checkpoints, retention, the fallback past a bad
// `latest`, the writer thread, and state.json.
#include "checkpoint/checkpoint_store.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "../core/test_support.hpp"
#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/crc32c.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/manifest.hpp"
#include "checkpoint/train_record.hpp"
#include "loom/error.hpp"
#include "loom/run/checkpoints.hpp"
#include "loom/safetensors.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {
namespace {

// Bit by bit, straight from the definition (reflected polynomial 0x82f63b78).
std::uint32_t crc32c_reference(const std::string& bytes) {
  std::uint32_t crc = 0xffffffffu;
  for (unsigned char b : bytes) {
    crc ^= b;
    for (int i = 0; i < 8; ++i) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(Crc32c, MatchesTheDefinition) {
  EXPECT_EQ(crc32c(0, "123456789", 9), 0xe3069283u);  // the standard check value
  EXPECT_EQ(crc32c(0, "", 0), 0u);
  std::mt19937 rng(7);
  for (std::size_t n : {1u, 7u, 8u, 9u, 63u, 64u, 1000u, 4097u}) {
    std::string s(n + 3, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    for (std::size_t offset = 0; offset < 3; ++offset) {  // unaligned starts too
      const std::string part = s.substr(offset, n);
      EXPECT_EQ(crc32c(0, part.data(), n), crc32c_reference(part)) << n << " bytes at " << offset;
      // Extending a CRC gives the CRC of the concatenation.
      const std::size_t half = n / 2;
      EXPECT_EQ(crc32c(crc32c(0, part.data(), half), part.data() + half, n - half), crc32c_reference(part));
    }
  }
}

// Files standing in for a checkpoint's: every required name, with contents that say which step.
void write_fake_files(const fs::path& dir, std::int64_t step) {
  for (const auto& name : required_files())
    write_synced(dir / name, name + " of step " + std::to_string(step) + std::string(1000, 'x'));
}

std::string contents_of(const fs::path& dir) {
  return read_whole(dir / "state.json");
}

std::string expected_contents(std::int64_t step) {
  return "state.json of step " + std::to_string(step) + std::string(1000, 'x');
}

std::vector<std::int64_t> steps_of(const CheckpointStore& store) {
  std::vector<std::int64_t> steps;
  for (const auto& c : store.list()) steps.push_back(c.step);
  return steps;
}

TEST(CheckpointStore, CommitsAndNamesTheLatest) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path() / "ckpt");
  EXPECT_FALSE(store.latest());
  const CommitResult r = store.commit(10, [](const fs::path& d) { write_fake_files(d, 10); });
  EXPECT_EQ(r.path, tmp.path() / "ckpt" / "step-10");
  EXPECT_EQ(store.latest(), 10);
  EXPECT_EQ(read_whole(tmp.path() / "ckpt" / "latest"), "step-10\n");
  const Verification v = verify_checkpoint(r.path);
  EXPECT_TRUE(v.ok) << v.describe(r.path);
  EXPECT_EQ(v.step, 10);
  EXPECT_EQ(r.bytes, v.bytes + fs::file_size(r.path / "manifest.json"));
  // Nothing else is left in the directory.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(store.dir())) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-10"}));
}

TEST(CheckpointStore, DirectoryNames) {
  EXPECT_EQ(CheckpointStore::parse_dir_name("step-120"), 120);
  EXPECT_EQ(CheckpointStore::parse_dir_name("step-0"), 0);
  for (const char* bad : {"step-", "step-012", "step-1x", "step--1", "steps-1", ".tmp-step-1-5", "latest"})
    EXPECT_FALSE(CheckpointStore::parse_dir_name(bad)) << bad;
}

TEST(CheckpointStore, RetentionKeepsTheLastAndThePermanentOnes) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path(), Retention{2, 10});
  std::vector<std::vector<std::int64_t>> removed;
  for (std::int64_t step = 5; step <= 35; step += 5)
    removed.push_back(store.commit(step, [&](const fs::path& d) { write_fake_files(d, step); }).removed);
  // Permanent: 10, 20, 30. Rolling, the last two: 25, 35.
  EXPECT_EQ(steps_of(store), (std::vector<std::int64_t>{10, 20, 25, 30, 35}));
  EXPECT_EQ(removed[2], (std::vector<std::int64_t>{}));   // 15: rolling 5, 15
  EXPECT_EQ(removed[4], (std::vector<std::int64_t>{5}));  // 25: rolling 15, 25
  EXPECT_EQ(removed[6], (std::vector<std::int64_t>{15}));
  EXPECT_EQ(store.latest(), 35);

  test::TempDir tmp1;
  CheckpointStore keep_one(tmp1.path(), Retention{1, 0});
  for (std::int64_t step = 1; step <= 4; ++step)
    keep_one.commit(step, [&](const fs::path& d) { write_fake_files(d, step); });
  EXPECT_EQ(steps_of(keep_one), (std::vector<std::int64_t>{4}));
}

// What a crash leaves, stage by stage: the child commits step 20 over a committed step 10 and is
// killed with SIGKILL right after `stage` (or in the middle of writing a file). The store must then
// name a complete checkpoint, the old one before `latest` is replaced and the new one after.
enum class CrashPoint {
  mid_file,
  temp_created,
  files_written,
  manifest_written,
  renamed,
  latest_replaced,
  retention_done
};

TEST(CheckpointStore, ACrashAtAnyStageLeavesTheOldOrTheNewCheckpoint) {
  const std::vector<std::pair<CrashPoint, std::int64_t>> cases = {
      {CrashPoint::mid_file, 10},         {CrashPoint::temp_created, 10}, {CrashPoint::files_written, 10},
      {CrashPoint::manifest_written, 10}, {CrashPoint::renamed, 10},      {CrashPoint::latest_replaced, 20},
      {CrashPoint::retention_done, 20}};
  for (const auto& [point, expected] : cases) {
    SCOPED_TRACE("crash point " + std::to_string(static_cast<int>(point)));
    test::TempDir tmp;
    CheckpointStore store(tmp.path(), Retention{1, 0});
    store.commit(10, [](const fs::path& d) { write_fake_files(d, 10); });

    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      CheckpointStore doomed(tmp.path(), Retention{1, 0});
      doomed.set_stage_hook([&](CommitStage s) {
        if (static_cast<int>(s) + 1 == static_cast<int>(point)) ::kill(::getpid(), SIGKILL);
      });
      doomed.commit(20, [&](const fs::path& d) {
        if (point == CrashPoint::mid_file) {
          write_synced(d / "model.safetensors", std::string(500, 'y'));
          std::ofstream(d / "state.json") << "state.json of st";  // half a file
          ::kill(::getpid(), SIGKILL);
        }
        write_fake_files(d, 20);
      });
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed";

    const CheckpointStore after(tmp.path(), Retention{1, 0});
    const LatestValid latest = after.find_latest_valid();
    ASSERT_TRUE(latest.checkpoint);
    EXPECT_EQ(latest.checkpoint->step, expected);
    EXPECT_TRUE(latest.warnings.empty()) << latest.warnings.front();
    EXPECT_EQ(contents_of(latest.checkpoint->path), expected_contents(expected));
    // The previous checkpoint is gone only once the new one is committed (retention comes last).
    if (expected == 10) {
      EXPECT_TRUE(verify_checkpoint(tmp.path() / "step-10").ok);
    }

    // The next run clears what the crash left and commits again.
    after.remove_leftovers();
    after.discard_after(latest.checkpoint->step);
    CheckpointStore again(tmp.path(), Retention{1, 0});
    again.commit(30, [](const fs::path& d) { write_fake_files(d, 30); });
    EXPECT_EQ(steps_of(again), (std::vector<std::int64_t>{30}));
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(tmp.path())) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-30"}));
  }
}

TEST(CheckpointStore, AFailedWriteLeavesNoTraceAndTheLatestUnchanged) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path());
  store.commit(10, [](const fs::path& d) { write_fake_files(d, 10); });
  EXPECT_THROW(store.commit(20, [](const fs::path&) { throw UserError("disk full"); }), UserError);
  EXPECT_EQ(store.latest(), 10);
  EXPECT_EQ(steps_of(store), (std::vector<std::int64_t>{10}));
  for (const auto& e : fs::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename().string().rfind(".tmp", 0), std::string::npos) << e.path();
}

struct Corruption {
  const char* name;
  std::function<void(const fs::path&)> damage;
  std::string file, words;
};

TEST(Verification, DetectsEveryKindOfCorruption) {
  const std::vector<Corruption> cases = {
      {"truncated", [](const fs::path& d) { fs::resize_file(d / "model.safetensors", 100); }, "model.safetensors",
       "is truncated: 100 bytes of the "},
      {"longer", [](const fs::path& d) { std::ofstream(d / "config.yaml", std::ios::app) << "more"; }, "config.yaml",
       "is longer than the manifest says"},
      {"flipped byte",
       [](const fs::path& d) {
         std::fstream f(d / "optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(40);
         f.put('Z');
       },
       "optimizer.safetensors", "fails its CRC-32C check"},
      {"missing file", [](const fs::path& d) { fs::remove(d / "state.json"); }, "state.json", "is missing"},
      {"manifest missing", [](const fs::path& d) { fs::remove(d / "manifest.json"); }, "manifest.json", "is missing"},
      {"manifest not JSON", [](const fs::path& d) { std::ofstream(d / "manifest.json") << "{\"format\": \"loom-che"; },
       "manifest.json", "is not valid JSON"},
      {"manifest of something else", [](const fs::path& d) { std::ofstream(d / "manifest.json") << "{\"a\": 1}"; },
       "manifest.json", "is not a loom checkpoint manifest"},
      {"manifest without a required file",
       [](const fs::path& d) {
         Manifest m = parse_manifest(read_whole(d / "manifest.json"));
         std::erase_if(m.files, [](const ManifestEntry& e) { return e.name == "optimizer.safetensors"; });
         std::ofstream(d / "manifest.json") << to_json(m);
       },
       "manifest.json", "does not list optimizer.safetensors"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    test::TempDir tmp;
    CheckpointStore store(tmp.path());
    const fs::path dir = store.commit(10, [](const fs::path& d) { write_fake_files(d, 10); }).path;
    ASSERT_TRUE(verify_checkpoint(dir).ok);
    c.damage(dir);
    const Verification v = verify_checkpoint(dir);
    EXPECT_FALSE(v.ok);
    EXPECT_EQ(v.file, c.file);
    EXPECT_NE(v.problem.find(c.words), std::string::npos) << v.problem;
    EXPECT_NE(v.describe(dir).find((dir / c.file).string()), std::string::npos) << v.describe(dir);
  }
}

TEST(CheckpointStore, FallsBackPastACorruptLatestNamingIt) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path(), Retention{3, 0});
  for (std::int64_t step : {10, 20, 30}) store.commit(step, [&](const fs::path& d) { write_fake_files(d, step); });
  fs::resize_file(tmp.path() / "step-30" / "state.json", 10);
  fs::remove(tmp.path() / "step-20" / "config.yaml");
  const LatestValid latest = store.find_latest_valid();
  ASSERT_TRUE(latest.checkpoint);
  EXPECT_EQ(latest.checkpoint->step, 10);
  ASSERT_EQ(latest.warnings.size(), 2u);
  EXPECT_NE(latest.warnings[0].find((tmp.path() / "step-30" / "state.json").string() + "' is truncated"),
            std::string::npos)
      << latest.warnings[0];
  EXPECT_NE(latest.warnings[1].find((tmp.path() / "step-20" / "config.yaml").string() + "' is missing"),
            std::string::npos)
      << latest.warnings[1];
  // A run resuming from 10 replaces what came after it; those that fail verification are moved
  // aside, never deleted.
  const Discarded discarded = store.discard_after(10);
  EXPECT_TRUE(discarded.removed.empty());
  ASSERT_EQ(discarded.set_aside.size(), 2u);
  EXPECT_EQ(discarded.set_aside[0].step, 20);
  EXPECT_EQ(discarded.set_aside[1].step, 30);
  EXPECT_NE(discarded.set_aside[1].problem.find("state.json' is truncated"), std::string::npos);
  EXPECT_EQ(steps_of(store), (std::vector<std::int64_t>{10}));
  EXPECT_FALSE(store.latest());
  EXPECT_EQ(store.find_latest_valid().checkpoint->step, 10);
  const auto aside = store.list_set_aside();
  ASSERT_EQ(aside.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(aside[i], discarded.set_aside[i].to);
    EXPECT_EQ(aside[i].filename().string().rfind("step-" + std::to_string(10 * (i + 2)) + ".unusable-", 0), 0u)
        << aside[i];
  }
  EXPECT_EQ(read_whole(aside[1] / "state.json"), "state.json");  // what was there, truncated: kept as it was
  // A verified checkpoint past the point is removed (the run replaces it).
  store.commit(20, [](const fs::path& d) { write_fake_files(d, 20); });
  EXPECT_EQ(store.discard_after(10).removed, (std::vector<std::int64_t>{20}));
  // `loom checkpoints` names the ones set aside; the run's leftover cleanup leaves them alone.
  store.remove_leftovers();
  EXPECT_EQ(store.list_set_aside().size(), 2u);
  const CheckpointsReport report = list_checkpoints(tmp.path());
  EXPECT_EQ(report.set_aside.size(), 2u);
  std::ostringstream printed;
  print_checkpoints(printed, report);
  EXPECT_NE(printed.str().find(aside[0].filename().string() + ": moved aside by loom"), std::string::npos)
      << printed.str();
}

// keep_last counts only checkpoints that verify, and one that fails is moved aside, not deleted:
// a run restarted over a bad step-20 keeps step-10 in its place.
TEST(CheckpointStore, RetentionCountsOnlyVerifiedCheckpointsAndDeletesNoBadOne) {
  test::TempDir tmp;
  {
    CheckpointStore first(tmp.path(), Retention{2, 0});
    for (std::int64_t step : {10, 20}) first.commit(step, [&](const fs::path& d) { write_fake_files(d, step); });
  }
  {
    std::fstream f(tmp.path() / "step-20" / "optimizer.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('!');
  }
  CheckpointStore store(tmp.path(), Retention{2, 0});
  const CommitResult r = store.commit(30, [](const fs::path& d) { write_fake_files(d, 30); });
  EXPECT_TRUE(r.removed.empty());
  ASSERT_EQ(r.set_aside.size(), 1u);
  EXPECT_EQ(r.set_aside[0].step, 20);
  EXPECT_NE(r.set_aside[0].problem.find("fails its CRC-32C check"), std::string::npos) << r.set_aside[0].problem;
  EXPECT_EQ(steps_of(store), (std::vector<std::int64_t>{10, 30}));
  ASSERT_EQ(store.list_set_aside().size(), 1u);
  EXPECT_TRUE(fs::exists(store.list_set_aside()[0] / "optimizer.safetensors"));
  // Then rolling as usual, over the verified ones.
  EXPECT_EQ(store.commit(40, [](const fs::path& d) { write_fake_files(d, 40); }).removed,
            (std::vector<std::int64_t>{10}));
  EXPECT_EQ(steps_of(store), (std::vector<std::int64_t>{30, 40}));
}

TEST(CheckpointStore, StepsPastLatestAreNotCommittedAndAMissingLatestFallsBackToTheNewest) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path(), Retention{5, 0});
  for (std::int64_t step : {10, 20}) store.commit(step, [&](const fs::path& d) { write_fake_files(d, step); });
  // A complete step-30 whose `latest` was never written (a crash between stages 4 and 5).
  fs::copy(tmp.path() / "step-20", tmp.path() / "step-30");
  EXPECT_EQ(store.find_latest_valid().checkpoint->step, 20);
  fs::remove(tmp.path() / "latest");
  const LatestValid newest = store.find_latest_valid();
  ASSERT_TRUE(newest.checkpoint);
  EXPECT_EQ(newest.checkpoint->step, 20);  // step-30's manifest says 20: passed over, named
  ASSERT_EQ(newest.warnings.size(), 1u);
  EXPECT_NE(newest.warnings[0].find("its manifest is for step 20"), std::string::npos) << newest.warnings[0];
  // `latest` naming a directory that is gone.
  write_synced(tmp.path() / "latest", "step-40\n");
  const LatestValid gone = store.find_latest_valid();
  ASSERT_TRUE(gone.checkpoint);
  EXPECT_EQ(gone.checkpoint->step, 20);
  EXPECT_NE(gone.warnings.front().find("names step-40, which does not exist"), std::string::npos);
}

TEST(CheckpointStore, LeftoversAreListedThenRemoved) {
  test::TempDir tmp;
  CheckpointStore store(tmp.path());
  store.commit(10, [](const fs::path& d) { write_fake_files(d, 10); });
  fs::create_directories(tmp.path() / ".tmp-step-20-999" / "x");
  fs::create_directories(tmp.path() / ".deleting-step-5-999");
  const CheckpointsReport report = list_checkpoints(tmp.path());
  EXPECT_EQ(report.leftovers.size(), 2u);
  ASSERT_EQ(report.checkpoints.size(), 1u);
  EXPECT_TRUE(report.checkpoints[0].verifies);
  EXPECT_TRUE(report.checkpoints[0].latest);
  store.remove_leftovers();
  EXPECT_TRUE(list_checkpoints(tmp.path()).leftovers.empty());
  EXPECT_TRUE(fs::exists(tmp.path() / "step-10"));
}

// The writer thread writes what the step loop had when it called save(), whatever the loop does
// to its tensors afterwards, and the same bytes as a synchronous write.
TEST(CheckpointWriter, AsyncWritesTheSnapshotAndTheSameBytesAsSync) {
  test::TempDir tmp;
  Tensor weights = Tensor::from(std::vector<float>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  Tensor moment = Tensor::from(std::vector<float>{0.5f, 0.25f}, Shape{2});
  auto snapshot = [&](std::int64_t step) {
    Snapshot s;
    s.step = step;
    s.model = {{"w", weights}};
    s.optimizer = {{"exp_avg/w", moment}};
    s.model_metadata = {{"loom.step", std::to_string(step)}};
    s.files = {{"state.json", "{}"}, {"config.yaml", "a: 1\n"}};
    return s;
  };
  {
    CheckpointWriter sync(CheckpointStore(tmp.path() / "sync"), false);
    sync.save(snapshot(1));
    EXPECT_EQ(sync.take_reports().size(), 1u);
  }
  {
    CheckpointWriter async(CheckpointStore(tmp.path() / "async"), true);
    async.save(snapshot(1));
    weights.data<float>()[0] = 100;  // the loop goes on
    moment.data<float>()[1] = 100;
    async.wait();
    const auto reports = async.take_reports();
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_EQ(reports[0].path, tmp.path() / "async" / "step-1");
    async.save(snapshot(2));  // the buffers are reused
  }
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "state.json", "config.yaml", "manifest.json"})
    EXPECT_EQ(read_whole(tmp.path() / "sync" / "step-1" / f), read_whole(tmp.path() / "async" / "step-1" / f)) << f;
  const safetensors::Reader second(tmp.path() / "async" / "step-2" / "model.safetensors");
  EXPECT_EQ(second.read("w").to_vector()[0], 100.0f);
}

TEST(CheckpointWriter, AWriteErrorReachesTheStepLoop) {
  test::TempDir tmp;
  tmp.write("blocked", "a file where the checkpoint directory should be");
  CheckpointWriter writer(CheckpointStore(tmp.path() / "blocked"), true);
  Snapshot s;
  s.step = 1;
  writer.save(s);
  try {
    writer.wait();
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("while writing checkpoint step-1"), std::string::npos) << e.what();
  }
}

TEST(TrainRecord, RoundTripsExactly) {
  TrainRecord r;
  r.step = 120;
  r.saved_at = utc_now();
  r.loom_version = "0.1.0";
  r.run_id = "run-a";
  r.config_hash = "crc32c:01234567";
  r.num_train_steps = 400;
  r.threads = 2;
  r.seed = 18446744073709551615ull;
  r.micro_steps = 4;
  r.next_batch = 120;
  r.batch_size = 16;
  r.seq_len = 128;
  r.skipped_steps = 3;
  r.has_skip_window = true;
  r.skip_losses = {0.1 + 0.2, 1.0 / 3.0, std::nan(""), INFINITY};
  r.skip_grad_norms = {1e-300, 5e300, -INFINITY, 2.5};
  r.optimizer_type = "adamw";
  r.optimizer_updates = 117;
  r.tokenizer_type = "byte";
  r.vocab_size = 256;
  r.trackers = {"jsonl", "tensorboard"};
  r.interval_steps = 7;
  r.interval_loss = 23.123456789012345;
  r.interval_seconds = 0.1;
  r.train_seconds = 12.5;
  r.elapsed_seconds = 13.75;
  const TrainRecord back = parse_train_record(to_json(r));
  EXPECT_EQ(to_json(back), to_json(r));
  EXPECT_EQ(back.seed, r.seed);
  EXPECT_EQ(back.interval_loss, r.interval_loss);
  EXPECT_EQ(back.skip_losses[0], r.skip_losses[0]);
  EXPECT_TRUE(std::isnan(back.skip_losses[2]));
  EXPECT_EQ(back.skip_grad_norms[2], -INFINITY);
  EXPECT_THROW(parse_train_record("{\"format\": \"loom-train-state\", \"version\": 1}"), UserError);
  EXPECT_THROW(parse_train_record("not json"), UserError);
}

}  // namespace
}  // namespace loom::checkpoint
