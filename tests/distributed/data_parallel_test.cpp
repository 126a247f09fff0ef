// Data-parallel training as a user runs it: `mpirun -np N loom train ...` against one process
// with the same global batch in N micro-batches. One micro-batch per rank gives the same
// training bit for bit (the collective sums in rank order, as one process sums its micro-batches
// in order); more than one per rank differs only by the association of float sums.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../core/test_support.hpp"
#include "distributed_test_support.hpp"
#include "loom/safetensors.hpp"

namespace {

namespace fs = std::filesystem;
using loom::test::CommandResult;
using loom::test::run_command;
using namespace loom::test::distributed;

TEST(DataParallel, TwoRanksOfOneMicroBatchEqualOneProcessOfTwoBitForBit) {
  const fs::path one = scratch("one"), two = scratch("two");
  const auto single = run_command(train_args(one, 4), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto parallel = mpirun(2, train_args(two, 4));
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
  EXPECT_NE(parallel.out.find("data parallel: 2 ranks"), std::string::npos) << parallel.out;
  EXPECT_NE(parallel.out.find("2 ranks"), std::string::npos);
  // Rank 0 alone prints the run: one header, one closing line.
  EXPECT_EQ(parallel.out.find("done:"), parallel.out.rfind("done:")) << parallel.out;

  const auto l1 = losses(one), l2 = losses(two);
  ASSERT_EQ(l1.size(), 20u);
  EXPECT_EQ(l1, l2);  // exactly
  EXPECT_EQ(max_relative_difference(one / "model.safetensors", two / "model.safetensors"), 0.0);
}

// DPO: each rank's rows are whole pairs, the loss a mean over the batch's pairs, the reference
// built on every rank from the starting weights.
TEST(DataParallel, DpoOnTwoRanksEqualsOneProcessBitForBit) {
  const fs::path one = scratch("dpo-one"), two = scratch("dpo-two");
  auto args = [](const fs::path& dir) {
    return std::vector<std::string>{LOOM_BINARY,
                                    "train",
                                    std::string(LOOM_SOURCE_DIR) + "/configs/dpo-tiny.yaml",
                                    "data.paths=[" + std::string(LOOM_SOURCE_DIR) + "/configs/data/preferences.jsonl]",
                                    "trainer.run_dir=" + dir.string(),
                                    "trainer.num_train_steps=6",
                                    "trainer.log_every=1",
                                    "trainer.train_batch_size=8",
                                    "trainer.microbatch_size=4",
                                    "trainer.steps_per_eval=0",
                                    "trainer.max_eval_batches=1",
                                    "trainer.peak_flops=1e11",
                                    "trainer.trackers=[jsonl]",
                                    "model.num_layers=2"};
  };
  const auto single = run_command(args(one), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto parallel = mpirun(2, args(two));
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
  const auto l1 = losses(one), l2 = losses(two);
  ASSERT_EQ(l1.size(), 6u);
  EXPECT_NEAR(l1.front(), std::log(2.0), 1e-6);
  EXPECT_EQ(l1, l2);
  EXPECT_EQ(max_relative_difference(one / "model.safetensors", two / "model.safetensors"), 0.0);
}

TEST(DataParallel, FourRanksOfTwoMicroBatchesStayWithinRoundingOfOneProcess) {
  const fs::path one = scratch("one4"), four = scratch("four");
  // SGD: an update proportional to the gradient, so rounding differences are not amplified the
  // way AdamW's normalisation amplifies them near zero.
  auto args1 = train_args(one, 1), args4 = train_args(four, 1);
  for (auto* a : {&args1, &args4}) a->insert(a->end(), {"optimizer.type=sgd", kFloat32Products});
  const auto single = run_command(args1, {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto parallel = mpirun(4, args4);
  ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
  const auto l1 = losses(one), l4 = losses(four);
  ASSERT_EQ(l1.size(), l4.size());
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l4[i], 1e-6 * std::abs(l1[i])) << "step " << i + 1;
  EXPECT_LT(max_relative_difference(one / "model.safetensors", four / "model.safetensors"), 1e-6);
}

TEST(DataParallel, ShardedOptimizerStateTrainsAsOneProcessDoes) {
  const fs::path one = scratch("zero-one"), four = scratch("zero-four");
  const auto single = run_command(train_args(one, 2), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  auto args = train_args(four, 2);
  args.push_back("trainer.shard_optimizer_state=true");
  const auto sharded = mpirun(4, args);
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  EXPECT_NE(sharded.out.find("(sharded, ZeRO-1)"), std::string::npos) << sharded.out;
  // The same updates: only the gradient norm's double sum is associated differently.
  const auto l1 = losses(one), l4 = losses(four);
  ASSERT_EQ(l1.size(), l4.size());
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l4[i], 1e-6 * std::abs(l1[i])) << "step " << i + 1;
  EXPECT_LT(max_relative_difference(one / "model.safetensors", four / "model.safetensors"), 1e-6);
}

// Frozen parameters (trainer.frozen) and LoRA adapters: the ranks bucket and reduce only the
// trained gradients, and ZeRO-1 shards only their optimizer state.
TEST(DataParallel, FrozenParametersAndLoraAdaptersTrainAsOneProcessDoes) {
  {
    const fs::path one = scratch("frozen-one"), two = scratch("frozen-two");
    auto args1 = train_args(one, 4), args2 = train_args(two, 4);
    for (auto* a : {&args1, &args2}) a->push_back("trainer.frozen=[wte, wpe, 'h.0.*']");
    const auto single = run_command(args1, {"LOOM_NUM_THREADS=1"});
    ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
    const auto parallel = mpirun(2, args2);
    ASSERT_EQ(parallel.exit_code, 0) << parallel.out << parallel.err;
    EXPECT_EQ(losses(one), losses(two));
    EXPECT_EQ(max_relative_difference(one / "model.safetensors", two / "model.safetensors"), 0.0);
  }
  const fs::path one = scratch("lora-one"), two = scratch("lora-two");
  auto args1 = train_args(one, 2), args2 = train_args(two, 2);
  for (auto* a : {&args1, &args2}) a->insert(a->end(), {"lora.rank=4", "lora.dropout=0.1", kFloat32Products});
  args2.push_back("trainer.shard_optimizer_state=true");
  const auto single = run_command(args1, {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;
  const auto sharded = mpirun(2, args2);
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  const auto l1 = losses(one), l2 = losses(two);
  ASSERT_EQ(l1.size(), l2.size());
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l2[i], 1e-6 * std::abs(l1[i])) << "step " << i + 1;
  EXPECT_LT(max_relative_difference(one / "adapter_model.safetensors", two / "adapter_model.safetensors"), 1e-5);
}

// A checkpoint holds the whole state whatever number of ranks wrote it, sharded or not, and
// resumes on any number of ranks.
TEST(DataParallel, CheckpointsWrittenByNRanksResumeOnM) {
  const fs::path reference = scratch("ckpt-reference"), a = scratch("ckpt-2-then-4"), b = scratch("ckpt-4-then-1");
  // A constant learning rate: a schedule over 10 steps is not the first half of one over 20.
  auto with = [](std::vector<std::string> args, std::initializer_list<const char*> more) {
    for (const char* m : more) args.emplace_back(m);
    args.emplace_back(kFloat32Products);
    return args;
  };
  const auto single = run_command(
      with(train_args(reference, 2), {"optimizer.type=sgd", "lr_schedule.type=constant", "lr_schedule.warmup=0"}),
      {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(single.exit_code, 0) << single.out << single.err;

  // 2 ranks unsharded for 10 steps, then 4 sharded ranks continue to 20.
  auto first = with(train_args(a, 2), {"optimizer.type=sgd", "lr_schedule.type=constant", "lr_schedule.warmup=0",
                                       "trainer.checkpoint.save_every_steps=5"});
  first[4] = "trainer.num_train_steps=10";
  auto r = mpirun(2, first);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = mpirun(4,
             with(train_args(a, 2), {"optimizer.type=sgd", "lr_schedule.type=constant", "lr_schedule.warmup=0",
                                     "trainer.checkpoint.save_every_steps=5", "trainer.shard_optimizer_state=true"}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed from checkpoint"), std::string::npos) << r.out;

  // 4 sharded ranks for 10 steps (each writes its part of the checkpoint), then one process.
  auto sharded =
      with(train_args(b, 2), {"optimizer.type=sgd", "lr_schedule.type=constant", "lr_schedule.warmup=0",
                              "trainer.checkpoint.save_every_steps=5", "trainer.shard_optimizer_state=true"});
  sharded[4] = "trainer.num_train_steps=10";
  r = mpirun(4, sharded);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_command(with(train_args(b, 2), {"optimizer.type=sgd", "lr_schedule.type=constant", "lr_schedule.warmup=0",
                                          "trainer.checkpoint.save_every_steps=5"}),
                  {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;

  for (const fs::path& dir : {a, b}) {
    const auto expected = losses(reference), got = losses(dir);
    ASSERT_EQ(expected.size(), got.size()) << dir;
    for (std::size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(expected[i], got[i], 1e-6 * std::abs(expected[i])) << dir << " step " << i + 1;
    EXPECT_LT(max_relative_difference(reference / "model.safetensors", dir / "model.safetensors"), 1e-6) << dir;
  }
}

// ZeRO-1's arguments for the checkpoint tests: a constant learning rate (a schedule over 10 steps
// is not the first half of one over 20), float32 products, a checkpoint every 5 steps.
std::vector<std::string> checkpointed(const fs::path& dir, std::int64_t steps, std::vector<std::string> more = {}) {
  auto args = train_args(dir, 2);
  args[4] = "trainer.num_train_steps=" + std::to_string(steps);
  for (const char* a :
       {"lr_schedule.type=constant", "lr_schedule.warmup=0", "trainer.checkpoint.save_every_steps=5", kFloat32Products})
    args.emplace_back(a);
  for (auto& m : more) args.push_back(std::move(m));
  return args;
}

const char* const kZeroOne = "trainer.shard_optimizer_state=true";

// ZeRO-1's ranks each write their part of a checkpoint (no gather to rank 0), and the checkpoint
// resumes on any number of ranks exactly as a run started there from it: one process and four
// ranks of one micro-batch each (whose sums associate as one process's micro-batches do) continue
// to the same bits; four ZeRO-1 ranks to within rounding of them.
TEST(DataParallel, ZeroOneRanksWriteTheirOwnPartsAndTheCheckpointResumesOnAnyNumberOfRanks) {
  const fs::path written = scratch("parts-2"), one = scratch("parts-then-1"), four = scratch("parts-then-4"),
                 four_sharded = scratch("parts-then-4-zero");
  // With a weight average, which each rank writes for the parameters it owns, and which every
  // rank reads whole.
  const char* const average = "trainer.ema_decay=0.9";
  auto r = mpirun(2, checkpointed(written, 10, {kZeroOne, average}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const fs::path step10 = written / "checkpoints" / "step-10";
  for (const char* f : {"model.rank-00000-of-00002.safetensors", "model.rank-00001-of-00002.safetensors",
                        "optimizer.rank-00000-of-00002.safetensors", "optimizer.rank-00001-of-00002.safetensors"})
    EXPECT_TRUE(fs::exists(step10 / f)) << f;
  EXPECT_FALSE(fs::exists(step10 / "model.safetensors"));
  // Each rank wrote the optimizer state it owns: neither file holds all of it.
  const loom::safetensors::Reader part0(step10 / "optimizer.rank-00000-of-00002.safetensors"),
      part1(step10 / "optimizer.rank-00001-of-00002.safetensors");
  EXPECT_GT(part0.tensors().size(), 0u);
  EXPECT_GT(part1.tensors().size(), 0u);
  for (const auto& t : part0.tensors()) EXPECT_FALSE(part1.contains(t.name)) << t.name;
  r = run_command({LOOM_BINARY, "checkpoints", written.string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("data 2 x fsdp 1 x tensor 1   yes  (latest)"), std::string::npos) << r.out;

  const std::string from = "trainer.resume=" + step10.string();
  r = run_command(checkpointed(one, 20, {from, average}), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("resumed from checkpoint " + step10.string() + " at step 10"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("holds no weight average"), std::string::npos) << r.out;
  r = mpirun(4, checkpointed(four, 20, {from, average}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = mpirun(4, checkpointed(four_sharded, 20, {from, kZeroOne, average}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  r = run_command({LOOM_BINARY, "checkpoints", four_sharded.string()});
  EXPECT_NE(r.out.find("data 4 x fsdp 1 x tensor 1   yes  (latest)"), std::string::npos) << r.out;

  const auto l1 = losses(one), l4 = losses(four), l4z = losses(four_sharded);
  ASSERT_EQ(l1.size(), 10u);
  EXPECT_EQ(l1, l4);  // exactly
  EXPECT_EQ(max_relative_difference(one / "model.safetensors", four / "model.safetensors"), 0.0);
  ASSERT_EQ(l1.size(), l4z.size());
  for (std::size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], l4z[i], 1e-6 * std::abs(l1[i])) << "step " << i + 11;
  EXPECT_LT(max_relative_difference(one / "model.safetensors", four_sharded / "model.safetensors"), 1e-6);
}

// A rank killed (SIGKILL, LOOM_TEST_CHECKPOINT_KILL) at several moments of a checkpoint's write:
// the previous checkpoint stays `latest` and verifies, and the same command resumes from it to the
// uninterrupted run's bits.
TEST(DataParallel, ARankKilledWhileACheckpointIsWrittenLeavesThePreviousOneAndTheRunResumes) {
  const fs::path reference = scratch("kill-reference");
  auto r = mpirun(2, checkpointed(reference, 15, {kZeroOne}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* moment :
       {"1:temp_created:10", "1:files_written:10", "0:files_written:10", "0:manifest_written:10"}) {
    SCOPED_TRACE(moment);
    const fs::path dir = scratch(std::string("kill-") + moment[0] + "-" + (moment + 2));
    auto env = kMpiEnv;
    env.push_back(std::string("LOOM_TEST_CHECKPOINT_KILL=") + moment);
    r = mpirun(2, checkpointed(dir, 15, {kZeroOne}), env);
    EXPECT_NE(r.exit_code, 0) << r.out << r.err;
    EXPECT_EQ(file_bytes(dir / "checkpoints" / "latest"), "step-5\n");
    EXPECT_FALSE(fs::exists(dir / "checkpoints" / "step-10"));
    r = run_command({LOOM_BINARY, "checkpoints", dir.string()});
    EXPECT_NE(r.out.find("data 2 x fsdp 1 x tensor 1   yes  (latest)"), std::string::npos) << r.out;

    r = mpirun(2, checkpointed(dir, 15, {kZeroOne}));  // the same command
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find("resumed from checkpoint " + (dir / "checkpoints" / "step-5").string()), std::string::npos)
        << r.out;
    EXPECT_EQ(losses(dir), losses(reference));
    EXPECT_EQ(max_relative_difference(reference / "model.safetensors", dir / "model.safetensors"), 0.0);
  }
}

// `loom export`, `loom generate` and trainer.init_from read a checkpoint whose ranks each wrote a
// part as they read one file: the run's final weights are its live weights at the checkpoint's step.
TEST(DataParallel, ExportGenerateAndInitFromReadACheckpointOfParts) {
  const fs::path run = scratch("parts-readers"), hf_parts = scratch("parts-hf"), hf_file = scratch("file-hf");
  auto r = mpirun(2, checkpointed(run, 10, {kZeroOne}));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const fs::path step10 = run / "checkpoints" / "step-10";
  ASSERT_FALSE(fs::exists(step10 / "model.safetensors"));

  r = run_command({LOOM_BINARY, "export", step10.string(), "--format", "hf", hf_parts.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("the live weights of checkpoint " + step10.string()), std::string::npos) << r.out;
  r = run_command({LOOM_BINARY, "export", (run / "model.safetensors").string(), "--format", "hf", hf_file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(weights(hf_parts / "model.safetensors"), weights(hf_file / "model.safetensors"));

  const std::vector<std::string> generate{"--prompt", "The cat", "--greedy", "--max-new-tokens", "24"};
  auto from_parts = std::vector<std::string>{LOOM_BINARY, "generate", step10.string()};
  auto from_file = std::vector<std::string>{LOOM_BINARY, "generate", run.string()};
  from_parts.insert(from_parts.end(), generate.begin(), generate.end());
  from_file.insert(from_file.end(), generate.begin(), generate.end());
  const auto g1 = run_command(from_parts), g2 = run_command(from_file);
  ASSERT_EQ(g1.exit_code, 0) << g1.out << g1.err;
  ASSERT_EQ(g2.exit_code, 0) << g2.out << g2.err;
  EXPECT_EQ(g1.out, g2.out);
  EXPECT_FALSE(g1.out.empty());

  const fs::path init_parts = scratch("init-from-parts"), init_file = scratch("init-from-file");
  r = run_command(checkpointed(init_parts, 2, {"trainer.init_from=" + step10.string()}), {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("init_from: read 28 parameters: the live weights of checkpoint " + step10.string()),
            std::string::npos)
      << r.out;
  r = run_command(checkpointed(init_file, 2, {"trainer.init_from=" + (run / "model.safetensors").string()}),
                  {"LOOM_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(losses(init_parts), losses(init_file));
  EXPECT_EQ(max_relative_difference(init_parts / "model.safetensors", init_file / "model.safetensors"), 0.0);
}

// How often `what` occurs in `text`.
std::size_t occurrences(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

// An MPMD launch: `ranks` app contexts of one rank each, the last given `extra` overrides more.
CommandResult mpmd(const fs::path& dir, int ranks, const std::vector<std::string>& extra) {
  std::vector<std::string> args{LOOM_MPIRUN, "--oversubscribe"};
  for (int r = 0; r < ranks; ++r) {
    if (r > 0) args.push_back(":");
    args.insert(args.end(), {"-np", "1"});
    for (const auto& a : train_args(dir, 4)) args.push_back(a);
    if (r == ranks - 1) args.insert(args.end(), extra.begin(), extra.end());
  }
  return run_command(under_timeout(std::move(args)), kMpiEnv);
}

TEST(DataParallel, AConfigThatDiffersBetweenRanksIsRefusedNamingTheRankOnce) {
  // The last app context of an MPMD launch gets one override more.
  const auto r = mpmd(scratch("mismatch"), 3, {"optimizer.learning_rate=1e-3"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  // Every rank learns of the difference; rank 0 alone prints it.
  EXPECT_EQ(occurrences(r.out + r.err, "loom: error: the resolved config of rank 2 differs from rank 0's"), 1u)
      << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;
}

TEST(DataParallel, AnErrorOfOneRankIsPrintedByThatRankAlone) {
  const auto r = mpmd(scratch("one-rank"), 3, {"optimizer.bogus=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: error: rank 2: while validating "), 1u) << r.out << r.err;
  EXPECT_NE((r.out + r.err).find("optimizer.bogus: unknown option of optimizer 'adamw'"), std::string::npos);
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;
}

TEST(DataParallel, ABatchThatDoesNotSplitEvenlyIsAUserErrorPrintedOnce) {
  // 8 sequences over 3 ranks of micro-batches of 4.
  const auto r = mpirun(3, train_args(scratch("uneven"), 4));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err,
                        "loom: error: trainer.train_batch_size (8) must be a multiple of 3 ranks x the "
                        "micro-batch size (4)"),
            1u)
      << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;
}

// The peak resident memory the closing line reports (the largest rank's), in MiB.
long peak_mib(const std::string& out) {
  const std::size_t at = out.find("peak memory ");
  return at == std::string::npos ? -1 : std::stol(out.substr(at + 12));
}

// ZeRO-1 shards the optimizer state; the reduction must not spend more than that saves: the peak
// of a sharded rank is below the unsharded one's by at least half the state it does not hold.
TEST(DataParallel, ShardingTheOptimizerStateLowersThePeakMemoryOfEachRank) {
  auto args = [&](const fs::path& dir, bool sharded) {
    auto a = train_args(dir, 1);
    a[4] = "trainer.num_train_steps=2";
    a[6] = "trainer.train_batch_size=2";
    a[13] = "model.num_layers=4";  // about 28M parameters: 113 MiB per float32 copy
    a.insert(a.end(), {"model.hidden_dim=768", "model.seq_len=32", "model.num_heads=12",
                       std::string("trainer.shard_optimizer_state=") + (sharded ? "true" : "false")});
    return a;
  };
  const auto plain = mpirun(2, args(scratch("memory-plain"), false));
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  const auto sharded = mpirun(2, args(scratch("memory-sharded"), true));
  ASSERT_EQ(sharded.exit_code, 0) << sharded.out << sharded.err;
  auto state_mib = [](const std::string& out) {
    const std::size_t at = out.find("optimizer state ");
    return at == std::string::npos ? -1.0 : std::stod(out.substr(at + 16));
  };
  const double saved = state_mib(plain.out) - state_mib(sharded.out);
  ASSERT_GT(saved, 100) << plain.out << sharded.out;
  ASSERT_GT(peak_mib(plain.out), 0) << plain.out;
  EXPECT_LT(static_cast<double>(peak_mib(sharded.out)), static_cast<double>(peak_mib(plain.out)) - saved / 2)
      << "optimizer state saved " << saved << " MiB per rank\n"
      << plain.out << sharded.out;
}

// trainer.mesh: the header and the step lines say it; one that does not fit the ranks, or that
// asks for fsdp (not available yet), is refused before the run directory is made.
TEST(DataParallel, TheMeshIsShownAndAMeshThatDoesNotFitIsRefusedFirst) {
  const fs::path ok = scratch("mesh-ok");
  auto args = train_args(ok, 4);
  args[4] = "trainer.num_train_steps=2";
  args.push_back("trainer.mesh={data: 2, fsdp: -1}");
  auto r = mpirun(2, args);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("data parallel: 2 ranks: data 2 x fsdp 1 x tensor 1 ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("  2 ranks: data 2 x fsdp 1 x tensor 1\n"), std::string::npos) << r.out;

  const std::vector<std::pair<std::string, std::string>> refused = {
      {"trainer.mesh.data=3", "trainer.mesh {data: 3, fsdp: 1, tensor: 1} has 3 ranks but the run has 2 ranks"},
      {"trainer.mesh={data: -1, fsdp: 3}",
       "trainer.mesh {data: -1, fsdp: 3, tensor: 1} does not divide the 2 ranks of this run"},
      {"trainer.mesh={data: 1, fsdp: 2} trainer.shard_optimizer_state=true",
       "trainer.mesh (data 1 x fsdp 2 x tensor 1) shards the optimizer state along its fsdp axis already (ZeRO-3); "
       "trainer.shard_optimizer_state (ZeRO-1) is for the data axis of a mesh without one"},
      // It used to wrap to fsdp 2 (4294967298 mod 2^32) and train.
      {"trainer.mesh={data: 1, fsdp: 4294967298}",
       "trainer.mesh.fsdp: expected an integer in [-1, 1048576], got 4294967298 (out of range)"},
  };
  for (const auto& [override_, message] : refused) {
    const fs::path dir = scratch("mesh-refused");
    auto refused_args = train_args(dir, 4);
    for (std::size_t at = 0; at <= override_.size();) {  // one override, or two separated by a space
      const std::size_t space = override_.find(" trainer.", at);
      refused_args.push_back(override_.substr(at, space == std::string::npos ? std::string::npos : space - at));
      at = space == std::string::npos ? override_.size() + 1 : space + 1;
    }
    r = mpirun(2, refused_args);
    EXPECT_NE(r.exit_code, 0) << override_;
    EXPECT_NE((r.out + r.err).find(message), std::string::npos) << override_ << "\n" << r.out << r.err;
    EXPECT_FALSE(fs::exists(dir)) << override_;
  }
}

// `mpirun -np 2` of `args` in its own process group, its output in `log`; the launcher's pid.
pid_t launch(std::vector<std::string> args, const fs::path& log) {
  args.insert(args.begin(), {LOOM_MPIRUN, "--oversubscribe", "-np", "2"});
  const pid_t launcher = fork();
  if (launcher == 0) {
    for (const auto& e : kMpiEnv) putenv(const_cast<char*>(e.c_str()));
    FILE* f = std::freopen(log.c_str(), "w", stdout);
    (void)f;
    dup2(fileno(stdout), 2);
    setpgid(0, 0);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return launcher;
}

// Trains on 2 ranks until metrics appear (and `ready` holds), SIGKILLs rank 1 (a child of mpirun
// with OMPI_COMM_WORLD_RANK=1) and checks that the run ends within 30 s naming it.
void kill_rank_one(
    const fs::path& dir, const std::vector<std::string>& args,
    const std::function<bool()>& ready = [] { return true; }) {
  const fs::path log = dir.parent_path() / (dir.filename().string() + ".log");
  const pid_t launcher = launch(args, log);
  ASSERT_GE(launcher, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!(fs::exists(dir / "metrics.jsonl") && ready()) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(fs::exists(dir / "metrics.jsonl")) << file_bytes(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  pid_t victim = -1;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string env = file_bytes(entry.path() / "environ");
    if (env.find("OMPI_COMM_WORLD_RANK=1") == std::string::npos) continue;
    if (file_bytes(entry.path() / "cmdline").find("loom") == std::string::npos) continue;
    std::istringstream stat(file_bytes(entry.path() / "stat"));
    std::string pid, comm, state;
    pid_t parent = -1;
    stat >> pid >> comm >> state >> parent;
    if (parent == launcher) victim = std::stoi(pid);
  }
  ASSERT_GT(victim, 0) << "rank 1 not found";
  const auto killed_at = std::chrono::steady_clock::now();
  ::kill(victim, SIGKILL);
  int status = 0;
  pid_t done = 0;
  while ((done = waitpid(launcher, &status, WNOHANG)) == 0 &&
         std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(30))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (done == 0) {
    ::kill(-launcher, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "the run did not end within 30 s of rank 1's death:\n" << file_bytes(log);
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << file_bytes(log);
  EXPECT_NE(file_bytes(log).find("rank 1"), std::string::npos) << file_bytes(log);
  // The survivor, sent SIGTERM by mpirun, says that a rank was lost, not that it saves a checkpoint.
  EXPECT_NE(file_bytes(log).find("loom: SIGTERM: rank 1 of this run (pid " + std::to_string(victim) + ") is gone"),
            std::string::npos)
      << file_bytes(log);
  EXPECT_EQ(file_bytes(log).find("saving a checkpoint"), std::string::npos) << file_bytes(log);
  // No final weights of a run that did not finish.
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
}

TEST(DataParallel, ARankThatDiesEndsTheRunWithinThirtySecondsNamingIt) {
  const fs::path dir = scratch("killed");
  auto args = train_args(dir, 4);
  args[4] = "trainer.num_train_steps=100000";
  kill_rank_one(dir, args);
}

// Under fully sharded data parallelism a rank dies inside a gather or a reduce-scatter: the other
// ends within 30 s naming it, and the same mpirun command resumes from the last checkpoint.
TEST(DataParallel, ARankThatDiesUnderFsdpEndsTheRunAndTheSameCommandResumes) {
  const fs::path dir = scratch("killed-fsdp");
  auto args = train_args(dir, 4);
  args[4] = "trainer.num_train_steps=100000";
  args.insert(args.end(),
              {"trainer.mesh.fsdp=2", "trainer.checkpoint.save_every_steps=5", "trainer.checkpoint.async=false"});
  kill_rank_one(dir, args, [&] { return fs::exists(dir / "checkpoints" / "step-10"); });
  if (HasFatalFailure()) return;
  // The same command again: it resumes from the last committed checkpoint, and trains on.
  const fs::path log = dir.parent_path() / "killed-fsdp-again.log";
  const pid_t again = launch(args, log);
  ASSERT_GE(again, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (file_bytes(log).find("step ") == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ::kill(-again, SIGKILL);
  int status = 0;
  waitpid(again, &status, 0);
  EXPECT_NE(file_bytes(log).find("resumed from checkpoint"), std::string::npos) << file_bytes(log);
}

// A set-up error that every rank meets is printed once, by rank 0: a broken trainer.eval_tasks
// file (read after the ranks connected), and a config file that does not exist (read before).
// One rank's own error (an override only it was given) is printed by that rank, with its rank.
TEST(DataParallel, ASetUpErrorOfEveryRankIsPrintedOnceAndOneRanksByThatRank) {
  const fs::path dir = scratch("broken-tasks");
  fs::create_directories(dir.parent_path());
  const fs::path tasks = dir.parent_path() / "broken-tasks.jsonl";
  std::ofstream(tasks) << "{\"ctx\": \"not closed\n";
  auto args = train_args(dir, 4);
  args.push_back("trainer.eval_tasks=[hellaswag:" + tasks.string() + "]");
  auto r = mpirun(2, args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: error: while reading trainer.eval_tasks"), 1u) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;

  args = train_args(dir, 4);
  args[2] = (dir.parent_path() / "no-such-config.yaml").string();
  r = mpirun(2, args);
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: error: while loading " + args[2]), 1u) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;

  r = mpmd(scratch("one-rank-override"), 3, {"trainer.=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: error: rank 2: override 'trainer.=1'"), 1u) << r.out << r.err;
  EXPECT_EQ(occurrences(r.out + r.err, "loom: "), 1u) << r.out << r.err;
}

// Whether process `pid` runs (a zombie, exited and not yet reaped, does not).
bool running(pid_t pid) {
  if (::kill(pid, 0) != 0 && errno == ESRCH) return false;
  const std::string stat = file_bytes("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

// The loom ranks `launcher` started, by rank.
std::vector<pid_t> ranks_of(pid_t launcher, int ranks) {
  std::vector<pid_t> out(static_cast<std::size_t>(ranks), -1);
  for (const auto& entry : fs::directory_iterator("/proc")) {
    if (file_bytes(entry.path() / "cmdline").find("loom") == std::string::npos) continue;
    std::istringstream stat(file_bytes(entry.path() / "stat"));
    std::string pid, comm, state;
    pid_t parent = -1;
    stat >> pid >> comm >> state >> parent;
    if (parent != launcher) continue;
    const std::string env = file_bytes(entry.path() / "environ");
    for (int r = 0; r < ranks; ++r)
      if (env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(r) + std::string(1, '\0')) != std::string::npos)
        out[static_cast<std::size_t>(r)] = std::stoi(pid);
  }
  return out;
}

// Waits up to `seconds` for every one of `pids` to stop running; whether they did. Those still
// running after it are killed.
bool all_stop_within(const std::vector<pid_t>& pids, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  auto any_running = [&] {
    for (pid_t p : pids)
      if (running(p)) return true;
    return false;
  };
  while (any_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool stopped = !any_running();
  for (pid_t p : pids)
    if (running(p)) ::kill(p, SIGKILL);
  return stopped;
}

// `args` on 2 ranks until metrics appear; the launcher and its ranks.
std::pair<pid_t, std::vector<pid_t>> training(const fs::path& dir, const std::vector<std::string>& args) {
  const fs::path log = dir.parent_path() / (dir.filename().string() + ".log");
  const pid_t launcher = launch(args, log);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (!fs::exists(dir / "metrics.jsonl") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return {launcher, ranks_of(launcher, 2)};
}

// `kill -9` of mpirun alone: OpenMPI started the ranks outside its process group, and they used to
// train on. They notice that their launcher is gone and stop as on SIGTERM: a checkpoint at the
// next step boundary, then exit.
TEST(DataParallel, RanksWhoseLauncherIsKilledStopWithACheckpoint) {
  const fs::path dir = scratch("launcher-killed");
  auto args = train_args(dir, 4);
  args[4] = "trainer.num_train_steps=100000";
  args.push_back("trainer.checkpoint.async=false");
  const auto [launcher, ranks] = training(dir, args);
  ASSERT_TRUE(fs::exists(dir / "metrics.jsonl"));
  ASSERT_GT(ranks[0], 0);
  ASSERT_GT(ranks[1], 0);
  ::kill(launcher, SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  EXPECT_TRUE(all_stop_within(ranks, 60)) << "the ranks still train 60 s after their launcher was killed";
  // They stopped cleanly: a committed checkpoint of the step they stopped at.
  EXPECT_TRUE(fs::exists(dir / "checkpoints" / "latest")) << "no checkpoint";
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
}

// A second run of the same run directory is refused while any rank of the first still holds it:
// rank 0 killed (mpirun stopped, so that it does not end rank 1), rank 1 alone alive. Then mpirun
// is killed too: rank 1, stuck in a collective with the dead rank 0 and without a launcher, exits.
TEST(DataParallel, ASecondRunIsRefusedWhileAnyRankOfTheFirstHoldsTheRunDirectory) {
  const fs::path dir = scratch("held");
  auto args = train_args(dir, 4);
  args[4] = "trainer.num_train_steps=100000";
  const auto [launcher, ranks] = training(dir, args);
  ASSERT_TRUE(fs::exists(dir / "metrics.jsonl"));
  ASSERT_GT(ranks[0], 0);
  ASSERT_GT(ranks[1], 0);
  ::kill(launcher, SIGSTOP);
  ::kill(ranks[0], SIGKILL);
  EXPECT_TRUE(all_stop_within({ranks[0]}, 10));
  ASSERT_TRUE(running(ranks[1]));

  auto again = train_args(dir, 4);
  again[4] = "trainer.num_train_steps=100000";
  const auto r = run_command(under_timeout(again, 60), {"LOOM_NUM_THREADS=1"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("loom: error: run directory '" + dir.string() +
                       "' is in use: another loom run is training in it (pid " + std::to_string(ranks[1]) + " holds " +
                       (dir / ".lock").string()),
            std::string::npos)
      << r.err;

  ::kill(launcher, SIGKILL);
  int status = 0;
  waitpid(launcher, &status, 0);
  EXPECT_TRUE(all_stop_within({ranks[1]}, 60)) << "rank 1 still runs 60 s after its launcher was killed";
}

}  // namespace
