// Checkpoints whose ranks each write a part (checkpoint/sharded_checkpoint.hpp), written here by
// fake ranks of one process: one writer per rank, as on each rank of a run, committed by rank 0's
// once every part is written. The reader assembles any range of any entry from the rank files
// whatever the split; a range no file holds is an error naming it; a crash of any rank before the
// commit leaves the previous checkpoint.
#include "checkpoint/sharded_checkpoint.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <numeric>

#include "../core/test_support.hpp"
#include "checkpoint/checkpoint_store.hpp"
#include "checkpoint/checkpoint_writer.hpp"
#include "checkpoint/durable_io.hpp"
#include "checkpoint/manifest.hpp"
#include "loom/error.hpp"
#include "loom/run/checkpoints.hpp"

namespace fs = std::filesystem;

namespace loom::checkpoint {
namespace {

// 0, 1, 2, ... (+ offset), shaped `shape`.
Tensor counting(const Shape& shape, float offset = 0) {
  std::vector<float> v(static_cast<std::size_t>(shape.numel()));
  std::iota(v.begin(), v.end(), offset);
  return Tensor::from(v, shape);
}

// Elements [begin, end) of `whole`, as an entry of it.
Entry slice(const std::string& name, const Tensor& whole, std::int64_t begin, std::int64_t end) {
  const std::vector<float> all = whole.to_vector();
  const std::vector<float> part(all.begin() + begin, all.begin() + end);
  return Entry(name, Tensor::from(part, Shape{end - begin}), whole.shape(), begin, end);
}

const MeshSizes kMesh3 = {{"data", 1}, {"fsdp", 3}};

// The tensors of the test: A [10, 7] split unevenly (rank 1's range of it empty), B whole on rank 0,
// C [3, 4] split between ranks 1 and 2; their optimizer state split the same way.
const Tensor A = counting(Shape{10, 7}), B = counting(Shape{5}, 100), C = counting(Shape{3, 4}, 200);

std::vector<Snapshot> three_parts(std::int64_t step) {
  std::vector<Snapshot> parts(3);
  for (int r = 0; r < 3; ++r) {
    parts[r].step = step;
    parts[r].shards = 3;
    parts[r].rank = r;
    parts[r].mesh = kMesh3;
  }
  parts[0].model = {slice("A", A, 0, 23), Entry("B", B)};
  parts[1].model = {slice("A", A, 23, 23), slice("C", C, 0, 5)};
  parts[2].model = {slice("A", A, 23, 70), slice("C", C, 5, 12)};
  parts[0].optimizer = {slice("exp_avg/A", A, 0, 23), Entry("exp_avg/B", B)};
  parts[2].optimizer = {slice("exp_avg/A", A, 23, 70)};
  parts[0].files = {{"state.json", "{\"step\": " + std::to_string(step) + "}"}, {"config.yaml", "a: 1\n"}};
  return parts;
}

// Every rank's writer writes its part; once all are written, rank 0's commits.
CommitResult write_parts(const fs::path& dir, const std::vector<Snapshot>& parts, bool async,
                         const std::string& token = "test") {
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    CheckpointStore store(dir, Retention{2, 0});
    store.set_rank(static_cast<int>(r));
    writers.push_back(std::make_unique<CheckpointWriter>(std::move(store), async, token));
    writers.back()->save(parts[r]);
  }
  std::vector<ManifestEntry> all;
  for (auto& w : writers) {
    w->wait_idle();
    EXPECT_EQ(w->part_state(), PartState::written);
    for (const auto& f : w->part_files()) all.push_back(f);
  }
  for (std::size_t r = 1; r < writers.size(); ++r) writers[r]->drop_part();
  writers[0]->commit_parts(all);
  writers[0]->wait();
  const auto reports = writers[0]->take_reports();
  EXPECT_EQ(reports.size(), 1u);
  CommitResult result;
  if (!reports.empty()) result.path = reports[0].path;
  return result;
}

std::vector<float> values(const Tensor& t) {
  return t.to_vector();
}

std::vector<float> range_of(const Tensor& t, std::int64_t begin, std::int64_t end) {
  const std::vector<float> all = t.to_vector();
  return {all.begin() + begin, all.begin() + end};
}

TEST(ShardedCheckpoint, ThreeRanksPartsReadWholeAndInTheRangesOfAnyOtherMesh) {
  for (const bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    test::TempDir tmp;
    const CommitResult result = write_parts(tmp.path(), three_parts(10), async);
    EXPECT_EQ(result.path, tmp.path() / "step-10");
    const Verification v = verify_checkpoint(tmp.path() / "step-10");
    ASSERT_TRUE(v.ok) << v.describe(tmp.path() / "step-10");
    EXPECT_EQ(v.shards, 3);
    EXPECT_EQ(describe_mesh(v.mesh), "data 1 x fsdp 3");
    EXPECT_EQ(CheckpointStore(tmp.path()).latest(), 10);
    EXPECT_TRUE(is_sharded_checkpoint(tmp.path() / "step-10"));
    EXPECT_NE(read_whole(tmp.path() / "step-10" / "manifest.json").find("\"version\": 2"), std::string::npos);

    const TensorSet model(tmp.path() / "step-10", "model");
    EXPECT_EQ(model.shards(), 3);
    ASSERT_EQ(model.entries().size(), 3u);
    EXPECT_EQ(model.info("A").shape, (Shape{10, 7}));
    EXPECT_EQ(model.info("C").shape, (Shape{3, 4}));
    EXPECT_EQ(model.read("A").shape(), (Shape{10, 7}));
    EXPECT_EQ(values(model.read("A")), values(A));
    EXPECT_EQ(values(model.read("B")), values(B));
    EXPECT_EQ(values(model.read("C")), values(C));
    // Another mesh's ranges: across the boundaries of the ranks that wrote them.
    for (const auto& [begin, end] :
         std::vector<std::pair<std::int64_t, std::int64_t>>{{0, 35}, {35, 70}, {20, 30}, {22, 24}, {23, 23}, {69, 70}})
      EXPECT_EQ(values(model.read_range("A", begin, end)), range_of(A, begin, end)) << begin << ", " << end;
    EXPECT_EQ(values(model.read_range("C", 3, 9)), range_of(C, 3, 9));
    Tensor into = Tensor::zeros(Shape{3, 4});
    model.read_into("C", into);
    EXPECT_EQ(values(into), values(C));

    const TensorSet optimizer(tmp.path() / "step-10", "optimizer");
    EXPECT_EQ(values(optimizer.read("exp_avg/A")), values(A));
    EXPECT_EQ(values(optimizer.read("exp_avg/B")), values(B));
    // `loom checkpoints` says what wrote it.
    const CheckpointsReport report = list_checkpoints(tmp.path());
    ASSERT_EQ(report.checkpoints.size(), 1u);
    EXPECT_EQ(report.checkpoints[0].mesh, "data 1 x fsdp 3");
    EXPECT_TRUE(report.checkpoints[0].verifies) << report.checkpoints[0].problem;
  }
}

TEST(ShardedCheckpoint, ARangeNoRankWroteIsAnErrorNamingTheCheckpointTheEntryAndTheElements) {
  test::TempDir tmp;
  std::vector<Snapshot> parts = three_parts(10);
  parts[2].model = {slice("A", A, 50, 70), slice("C", C, 5, 12)};  // [23, 50) of A is lost
  write_parts(tmp.path(), parts, false);
  const TensorSet model(tmp.path() / "step-10", "model");
  EXPECT_EQ(values(model.read_range("A", 0, 23)), range_of(A, 0, 23));
  EXPECT_EQ(values(model.read_range("A", 55, 70)), range_of(A, 55, 70));
  try {
    model.read_range("A", 10, 60);
    FAIL() << "no error";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("checkpoint '" + (tmp.path() / "step-10").string() + "'"), std::string::npos) << m;
    EXPECT_NE(m.find("does not hold elements [23, 50) of 'A'"), std::string::npos) << m;
    EXPECT_NE(m.find("asked for [10, 60)"), std::string::npos) << m;
  }
  EXPECT_THROW(model.read("A"), UserError);
  EXPECT_THROW(model.read_range("A", 0, 71), UserError);
  EXPECT_THROW(model.info("D"), UserError);
}

TEST(ShardedCheckpoint, AMissingRankFileFailsVerificationAndTheReaderNamesIt) {
  test::TempDir tmp;
  write_parts(tmp.path(), three_parts(10), false);
  const fs::path dir = tmp.path() / "step-10";
  fs::remove(dir / "optimizer.rank-00001-of-00003.safetensors");
  const Verification v = verify_checkpoint(dir);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.file, "optimizer.rank-00001-of-00003.safetensors");
  try {
    TensorSet(dir, "optimizer");
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1's file optimizer.rank-00001-of-00003.safetensors is missing"),
              std::string::npos)
        << e.what();
  }
  // A manifest that leaves a rank's file out is refused, and so is a version this loom does not know.
  std::string manifest = read_whole(dir / "manifest.json");
  EXPECT_THROW(parse_manifest(std::string(manifest).replace(manifest.find("\"version\": 2"), 12, "\"version\": 3")),
               UserError);
  Manifest m = parse_manifest(manifest);
  m.files.erase(std::remove_if(m.files.begin(), m.files.end(),
                               [](const auto& f) { return f.name == "model.rank-00002-of-00003.safetensors"; }),
                m.files.end());
  fs::remove(dir / "manifest.json");
  write_synced(dir / "manifest.json", to_json(m));
  const Verification unlisted = verify_checkpoint(dir);
  EXPECT_FALSE(unlisted.ok);
  EXPECT_NE(unlisted.problem.find("does not list model.rank-00002-of-00003.safetensors"), std::string::npos)
      << unlisted.problem;
}

TEST(ShardedCheckpoint, OneProcessStillWritesTheUnshardedFormatAndTheReaderReadsItAlike) {
  test::TempDir tmp;
  CheckpointWriter writer(CheckpointStore(tmp.path()), false);
  Snapshot s;
  s.step = 3;
  s.model = {Entry("A", A), Entry("B", B)};
  s.optimizer = {Entry("exp_avg/A", A)};
  s.files = {{"state.json", "{}"}, {"config.yaml", "a: 1\n"}};
  writer.save(s);
  const fs::path dir = tmp.path() / "step-3";
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(is_sharded_checkpoint(dir));
  const std::string manifest = read_whole(dir / "manifest.json");
  EXPECT_NE(manifest.find("\"version\": 1"), std::string::npos);
  EXPECT_EQ(manifest.find("mesh"), std::string::npos) << manifest;  // byte for byte as before
  const TensorSet model(dir, "model");
  EXPECT_EQ(model.shards(), 0);
  EXPECT_EQ(values(model.read("A")), values(A));
  EXPECT_EQ(values(model.read_range("A", 5, 40)), range_of(A, 5, 40));
  EXPECT_EQ(list_checkpoints(tmp.path()).checkpoints.at(0).mesh, "1 rank");
  // A slice has no place in the one file of an unsharded checkpoint.
  s.step = 4;
  s.model = {slice("A", A, 0, 10)};
  EXPECT_THROW(writer.save(s), InternalError);
}

// A rank killed (SIGKILL) at any moment before rank 0 renames the checkpoint into place: the
// previous one stays `latest` and verifies; the next run clears the staging directory.
TEST(ShardedCheckpoint, AKilledRankAtAnyMomentBeforeTheCommitLeavesThePreviousCheckpoint) {
  struct Moment {
    const char* what;
    int rank;
    CommitStage stage;  // killed once it has reached it
  };
  const std::vector<Moment> moments = {
      {"rank 1 before its files", 1, CommitStage::temp_created},
      {"rank 1 after its files, before the agreement", 1, CommitStage::files_written},
      {"rank 0 after its files", 0, CommitStage::files_written},
      {"rank 0 after the manifest, before the rename", 0, CommitStage::manifest_written}};
  for (const Moment& moment : moments) {
    SCOPED_TRACE(moment.what);
    test::TempDir tmp;
    write_parts(tmp.path(), three_parts(10), false);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      std::vector<Snapshot> parts = three_parts(20);
      std::vector<std::unique_ptr<CheckpointWriter>> writers;
      for (int r = 0; r < 3; ++r) {
        CheckpointStore store(tmp.path(), Retention{1, 0});
        store.set_rank(r);
        if (r == moment.rank)
          store.set_stage_hook([&](CommitStage s) {
            if (s == moment.stage) ::kill(::getpid(), SIGKILL);
          });
        writers.push_back(std::make_unique<CheckpointWriter>(std::move(store), true, "crash"));
      }
      for (int r = 0; r < 3; ++r) writers[r]->save(parts[r]);
      std::vector<ManifestEntry> all;
      for (auto& w : writers) {
        w->wait_idle();
        for (const auto& f : w->part_files()) all.push_back(f);
      }
      writers[0]->commit_parts(all);
      writers[0]->wait();
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the child was not killed";

    const CheckpointStore after(tmp.path(), Retention{1, 0});
    const LatestValid latest = after.find_latest_valid();
    ASSERT_TRUE(latest.checkpoint);
    EXPECT_EQ(latest.checkpoint->step, 10);
    EXPECT_TRUE(latest.warnings.empty()) << latest.warnings.front();
    EXPECT_TRUE(verify_checkpoint(tmp.path() / "step-10").ok);
    EXPECT_EQ(values(TensorSet(tmp.path() / "step-10", "model").read("A")), values(A));
    EXPECT_FALSE(fs::exists(tmp.path() / "step-20"));
    EXPECT_TRUE(fs::exists(tmp.path() / ".tmp-step-20-crash"));
    after.remove_leftovers();
    EXPECT_FALSE(fs::exists(tmp.path() / ".tmp-step-20-crash"));
    write_parts(tmp.path(), three_parts(30), true, "again");
    EXPECT_EQ(CheckpointStore(tmp.path()).latest(), 30);
  }
}

TEST(ShardedCheckpoint, RankZeroRefusesToCommitWhenAnotherRanksFileIsNotInItsDirectory) {
  test::TempDir tmp;
  std::vector<Snapshot> parts = three_parts(10);
  std::vector<std::unique_ptr<CheckpointWriter>> writers;
  std::vector<ManifestEntry> all;
  for (int r = 0; r < 3; ++r) {
    writers.push_back(std::make_unique<CheckpointWriter>(CheckpointStore(tmp.path()), false, "t"));
    writers[r]->save(parts[r]);
    for (const auto& f : writers[r]->part_files()) all.push_back(f);
  }
  // As if rank 2 wrote onto its own node's disk.
  fs::remove(tmp.path() / ".tmp-step-10-t" / "model.rank-00002-of-00003.safetensors");
  try {
    writers[0]->commit_parts(all);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("every rank must write the checkpoints into the same directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(CheckpointStore(tmp.path()).latest());
  EXPECT_FALSE(fs::exists(tmp.path() / "step-10"));
}

TEST(ShardedCheckpoint, AFailedPartIsReportedByThePartState) {
  test::TempDir tmp;
  tmp.write("blocked", "a file where the checkpoint directory should be");
  for (const bool async : {false, true}) {
    CheckpointWriter writer(CheckpointStore(tmp.path() / "blocked"), async, "t");
    writer.save(three_parts(1)[1]);
    writer.wait_idle();
    EXPECT_EQ(writer.part_state(), PartState::failed);
    EXPECT_THROW(writer.wait(), UserError);
  }
}

}  // namespace
}  // namespace loom::checkpoint
