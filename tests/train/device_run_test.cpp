// `loom train` as a user runs it, on the test device `guarded`
// (tests/fixtures/plugins/guarded_backend.cpp: memory that faults on any host access outside the
// backend's own calls, arithmetic by the reference backend): every recipe trains 20 steps with
// the reference backend's losses, a run on it is read by `loom generate`, the copies between the
// host and the device per step are logged and the same every step and at every model size, and
// `mpirun -np 2` trains data parallel on it, staging the gradients through host memory. A host
// access would be a SIGSEGV (exit 139): passing means zero faults.
//
// Shapes are cut down (32 positions, two layers, four sequences a step): the guarded device runs
// the reference backend's loops and changes page protections around every kernel.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "../core/test_support.hpp"

namespace {

namespace fs = std::filesystem;
using loom::test::CommandResult;
using loom::test::run_command;

const std::string kSource = LOOM_SOURCE_DIR;
const std::string kDevices = std::string(LOOM_FIXTURE_DIR) + "/devices";

fs::path scratch(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("loom-device-run-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

// The environment of a run that may load the guarded backend (it is not installed).
std::vector<std::string> env() {
  return {"LOOM_PLUGIN_PATH=" + kDevices, "LOOM_NUM_THREADS=1"};
}

struct Recipe {
  std::string name, config;
  std::vector<std::string> overrides;
};

// The recipes, each as its config file with the shapes cut down.
std::vector<Recipe> recipes() {
  const std::string data = kSource + "/configs/data/";
  return {
      {"quickstart", "quickstart.yaml", {}},
      // A model preset without data: the synthetic corpus.
      {"llama-tiny", "llama-tiny.yaml", {"data.type=synthetic", "model.hidden_dim=64", "model.intermediate_dim=128"}},
      {"gemma2-tiny",
       "gemma2-tiny.yaml",
       {"model.sliding_window=16", "model.hidden_dim=64", "model.intermediate_dim=128"}},
      // Four experts of a narrower width: the guarded device runs the reference backend's loops.
      {"mixtral-tiny-remat",
       "mixtral-tiny.yaml",
       {"model.remat=full", "model.hidden_dim=64", "model.intermediate_dim=96", "model.moe.num_experts=4"}},
      // Its conversations need their 256 positions (the assistant's turn must fit).
      {"sft-tiny",
       "sft-tiny.yaml",
       {"data.paths=[" + data + "sft-tiny.jsonl]", "model.seq_len=256", "trainer.train_batch_size=2",
        "model.hidden_dim=32", "model.num_heads=2"}},
      // Its pairs need 128 positions.
      {"dpo-tiny",
       "dpo-tiny.yaml",
       {"data.paths=[" + data + "preferences.jsonl]", "model.seq_len=128", "model.hidden_dim=32", "model.num_heads=2"}},
      // LoRA from the initialisation (the recipe starts from a quickstart run's weights).
      {"lora-gpt2", "lora-gpt2.yaml", {"data.paths=[" + data + "tinyshakespeare.txt]", "trainer.init_from=\"\""}},
  };
}

void PrintTo(const Recipe& recipe, std::ostream* out) {
  *out << recipe.name;
}

std::vector<std::string> train_args(const Recipe& recipe, const std::string& backend, const fs::path& run_dir,
                                    std::vector<std::string> more = {}) {
  std::vector<std::string> args{LOOM_BINARY, "train", kSource + "/configs/" + recipe.config, "backend.type=" + backend,
                                // The guarded attention kernel computes with the naive one.
                                std::string("model.attention=") + (backend == "guarded" ? "guarded" : "naive"),
                                "trainer.run_dir=" + run_dir.string(), "trainer.num_train_steps=20",
                                "trainer.log_every=1", "trainer.train_batch_size=4", "trainer.microbatch_size=0",
                                "trainer.steps_per_eval=10", "trainer.max_eval_batches=1", "trainer.sample_length=0",
                                "trainer.peak_flops=1e11", "trainer.trackers=[jsonl]", "model.seq_len=32",
                                "model.num_layers=2"};
  args.insert(args.end(), recipe.overrides.begin(), recipe.overrides.end());
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Every record of the run's metrics.jsonl that has `key`, in order.
std::vector<double> metric(const fs::path& run_dir, const std::string& key) {
  std::vector<double> out;
  std::ifstream in(run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j[key].get<double>());
  }
  return out;
}

void expect_close(const std::vector<double>& device, const std::vector<double>& host, const std::string& what) {
  ASSERT_EQ(device.size(), host.size()) << what;
  for (std::size_t i = 0; i < host.size(); ++i)
    EXPECT_LE(std::abs(device[i] - host[i]), 1e-6) << what << " " << i << ": " << device[i] << " vs " << host[i];
}

// The number every step logged, checked to be the same every step after the first (whose count
// includes what a model copies to the device once and keeps there, such as rotary tables).
double constant_copies(const fs::path& run_dir) {
  const auto copies = metric(run_dir, "device/host_copies_per_step");
  EXPECT_EQ(copies.size(), 20u) << run_dir;
  if (copies.size() < 2) return -1;
  EXPECT_GE(copies.front(), copies.back()) << run_dir;
  for (std::size_t i = 1; i < copies.size(); ++i) EXPECT_EQ(copies[i], copies.back()) << run_dir << " step " << i + 1;
  return copies.back();
}

class DeviceRun : public ::testing::TestWithParam<Recipe> {};

TEST_P(DeviceRun, TrainsAsTheReferenceBackendAndGenerates) {
  const Recipe& recipe = GetParam();
  const fs::path host = scratch(recipe.name + "-reference"), device = scratch(recipe.name + "-guarded");
  const CommandResult h = run_command(train_args(recipe, "reference", host), env());
  ASSERT_EQ(h.exit_code, 0) << h.out << h.err;
  const CommandResult d = run_command(train_args(recipe, "guarded", device), env());
  ASSERT_EQ(d.exit_code, 0) << d.out << d.err;

  const auto losses = metric(host, "train/loss");
  ASSERT_EQ(losses.size(), 20u);
  expect_close(metric(device, "train/loss"), losses, "loss");
  expect_close(metric(device, "train/grad_norm"), metric(host, "train/grad_norm"), "gradient norm");
  expect_close(metric(device, "eval/loss"), metric(host, "eval/loss"), "evaluation loss");
  // Copies are counted on a device only, and each step makes as many as the last.
  EXPECT_TRUE(metric(host, "device/host_copies_per_step").empty());
  EXPECT_GT(constant_copies(device), 0);

  // `loom generate` reads the run on its device: the reference run's tokens.
  std::map<std::string, std::string> text;
  for (const auto& [name, dir] : {std::pair{"reference", host}, std::pair{"guarded", device}}) {
    const CommandResult g = run_command({LOOM_BINARY, "generate", dir.string(), "--prompt", "The ", "--max-new-tokens",
                                         "12", "--temperature", "0.8", "--seed", "3"},
                                        env());
    ASSERT_EQ(g.exit_code, 0) << name << ": " << g.out << g.err;
    text[name] = g.out;
  }
  EXPECT_FALSE(text["reference"].empty());
  EXPECT_EQ(text["guarded"], text["reference"]);
}

INSTANTIATE_TEST_SUITE_P(Recipes, DeviceRun, ::testing::ValuesIn(recipes()), [](const auto& info) {
  std::string name = info.param.name;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name;
});

// The count is a constant of the configuration: a model four times the parameters (twice the
// width, twice the layers) copies as often per step.
TEST(DeviceRunCopies, ThePerStepCountDoesNotGrowWithTheModel) {
  const Recipe small{"quickstart", "quickstart.yaml", {"model.hidden_dim=32"}};
  const Recipe large{"quickstart", "quickstart.yaml", {"model.hidden_dim=64", "model.num_layers=4"}};
  const fs::path a = scratch("copies-small"), b = scratch("copies-large");
  const CommandResult ra = run_command(train_args(small, "guarded", a, {"trainer.steps_per_eval=0"}), env());
  ASSERT_EQ(ra.exit_code, 0) << ra.out << ra.err;
  const CommandResult rb = run_command(train_args(large, "guarded", b, {"trainer.steps_per_eval=0"}), env());
  ASSERT_EQ(rb.exit_code, 0) << rb.out << rb.err;
  const double small_copies = constant_copies(a);
  EXPECT_GT(small_copies, 0);
  EXPECT_EQ(constant_copies(b), small_copies);
}

// A run on the device resumed from its checkpoint (weights, AdamW's moments and the weight
// average written from device memory and read back into it) continues as the uninterrupted run
// did, bit for bit: the same losses and the same final weights' bytes.
TEST(DeviceRunResume, AResumedRunEqualsTheUninterruptedOneBitForBit) {
  const Recipe quickstart{"quickstart",
                          "quickstart.yaml",
                          {"trainer.steps_per_eval=0", "trainer.num_train_steps=10", "trainer.ema_decay=0.9",
                           "trainer.checkpoint.save_every_steps=5"}};
  const fs::path whole = scratch("resume-whole"), resumed = scratch("resume-resumed");
  const CommandResult a = run_command(train_args(quickstart, "guarded", whole), env());
  ASSERT_EQ(a.exit_code, 0) << a.out << a.err;
  const CommandResult b = run_command(
      train_args(quickstart, "guarded", resumed, {"trainer.resume=" + (whole / "checkpoints" / "step-5").string()}),
      env());
  ASSERT_EQ(b.exit_code, 0) << b.out << b.err;
  EXPECT_NE(b.out.find("resumed from checkpoint"), std::string::npos) << b.out;
  const auto all = metric(whole, "train/loss"), after = metric(resumed, "train/loss");
  ASSERT_EQ(all.size(), 10u);
  ASSERT_EQ(after.size(), 5u);
  for (std::size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i], all[5 + i]) << "step " << 6 + i;
  std::ifstream wa(whole / "model.safetensors", std::ios::binary), wb(resumed / "model.safetensors", std::ios::binary);
  const std::string bytes_a((std::istreambuf_iterator<char>(wa)), {}),
      bytes_b((std::istreambuf_iterator<char>(wb)), {});
  EXPECT_FALSE(bytes_a.empty());
  EXPECT_TRUE(bytes_a == bytes_b) << "the final weights differ";
}

#ifdef LOOM_MPIRUN_PATH
// `mpirun -np 2` on the device: the collective (mpi) cannot send from its memory, so the
// gradients are staged through host memory, said once in the header; the training equals the
// reference backend's data-parallel run, with and without ZeRO-1.
TEST(DeviceRunDataParallel, TwoRanksTrainAsOnTheReferenceBackend) {
  const std::vector<std::string> mpi_env{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                         "OMPI_MCA_rmaps_base_oversubscribe=1", "LOOM_NUM_THREADS=1",
                                         "LOOM_PLUGIN_PATH=" + kDevices};
  const Recipe quickstart{"quickstart", "quickstart.yaml", {"trainer.steps_per_eval=0"}};
  for (const char* zero_one : {"false", "true"}) {
    std::map<std::string, fs::path> runs;
    for (const char* backend : {"reference", "guarded"}) {
      const fs::path dir = scratch(std::string("mpi-") + backend + "-" + zero_one);
      std::vector<std::string> args =
          train_args(quickstart, backend, dir, {std::string("trainer.shard_optimizer_state=") + zero_one});
      args.insert(args.begin(), {LOOM_MPIRUN_PATH, "--oversubscribe", "-np", "2"});
      const CommandResult r = run_command(args, mpi_env);
      ASSERT_EQ(r.exit_code, 0) << backend << ": " << r.out << r.err;
      const std::string note = "cannot send from guarded:0 memory: the gradients are staged through host memory";
      const auto at = r.out.find(note);
      if (std::string(backend) == "guarded") {
        EXPECT_NE(at, std::string::npos) << r.out;
        EXPECT_EQ(at, r.out.rfind(note)) << "said once: " << r.out;
      } else {
        EXPECT_EQ(at, std::string::npos) << r.out;
      }
      runs[backend] = dir;
    }
    const auto losses = metric(runs["reference"], "train/loss");
    ASSERT_EQ(losses.size(), 20u);
    expect_close(metric(runs["guarded"], "train/loss"), losses, std::string("loss, ZeRO-1 ") + zero_one);
    expect_close(metric(runs["guarded"], "train/grad_norm"), metric(runs["reference"], "train/grad_norm"),
                 std::string("gradient norm, ZeRO-1 ") + zero_one);
    EXPECT_GT(constant_copies(runs["guarded"]), 0);
  }
}

// Fully sharded data parallelism keeps its shards on the host: refused, naming the mesh.
TEST(DeviceRunDataParallel, FullyShardedOnTheDeviceIsOneClearError) {
  const std::vector<std::string> mpi_env{"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1",
                                         "OMPI_MCA_rmaps_base_oversubscribe=1", "LOOM_NUM_THREADS=1",
                                         "LOOM_PLUGIN_PATH=" + kDevices};
  const Recipe quickstart{"quickstart", "quickstart.yaml", {"trainer.mesh.fsdp=2"}};
  std::vector<std::string> args = train_args(quickstart, "guarded", scratch("fsdp"));
  args.insert(args.begin(), {LOOM_MPIRUN_PATH, "--oversubscribe", "-np", "2"});
  const CommandResult r = run_command(args, mpi_env);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("fully sharded data parallelism keeps the units in host memory"), std::string::npos)
      << r.out << r.err;
}
#endif

// What stays on the host is refused before training, naming it: a whole-matrix optimizer.
TEST(DeviceRunRefusals, AHostOnlyOptimizerIsOneClearError) {
  const Recipe quickstart{"quickstart", "quickstart.yaml", {"optimizer.type=muon", "trainer.steps_per_eval=0"}};
  const CommandResult r = run_command(train_args(quickstart, "guarded", scratch("muon")), env());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("muon: the parameters are in guarded:0 memory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
}

// ---- model.attention: auto, and a kernel on another device (docs/attention-kernels.md#auto) ----

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The command, `loom train configs/quickstart.yaml backend.type=guarded`, cut to three
// steps: quickstart.yaml's `attention: auto` picks the guarded device's kernel (the run directory's
// config records it), the run trains, and `loom generate` reads it back on the device.
TEST(DeviceRunAttention, AutoPicksTheKernelOfTheBackendsDevice) {
  const fs::path run = scratch("auto-guarded");
  const CommandResult r =
      run_command({LOOM_BINARY, "train", kSource + "/configs/quickstart.yaml", "backend.type=guarded",
                   "trainer.run_dir=" + run.string(), "trainer.num_train_steps=3", "trainer.log_every=1",
                   "trainer.train_batch_size=4", "trainer.steps_per_eval=0", "trainer.sample_length=0",
                   "trainer.peak_flops=1e11", "trainer.trackers=[jsonl]", "model.seq_len=32", "model.num_layers=2"},
                  env());
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(metric(run, "train/loss").size(), 3u);
  const std::string config = read_text(run / "config.yaml");
  const std::size_t attention = config.find("attention:");
  ASSERT_NE(attention, std::string::npos) << config;
  EXPECT_NE(config.find("type: guarded", attention), std::string::npos) << config;
  const CommandResult g =
      run_command({LOOM_BINARY, "generate", run.string(), "--prompt", "The ", "--max-new-tokens", "4"}, env());
  EXPECT_EQ(g.exit_code, 0) << g.out << g.err;

  // On the host, auto is flash (the fastest host kernel), recorded with its options.
  const fs::path host = scratch("auto-reference");
  const CommandResult h =
      run_command({LOOM_BINARY, "train", kSource + "/configs/quickstart.yaml", "backend.type=reference",
                   "trainer.run_dir=" + host.string(), "trainer.num_train_steps=1", "trainer.steps_per_eval=0",
                   "trainer.sample_length=0", "trainer.peak_flops=1e11", "trainer.trackers=[jsonl]", "model.seq_len=32",
                   "model.num_layers=1"},
                  env());
  ASSERT_EQ(h.exit_code, 0) << h.out << h.err;
  const std::string host_config = read_text(host / "config.yaml");
  const std::size_t host_attention = host_config.find("attention:");
  ASSERT_NE(host_attention, std::string::npos) << host_config;
  EXPECT_NE(host_config.find("type: flash", host_attention), std::string::npos) << host_config;
  EXPECT_NE(host_config.find("block_q", host_attention), std::string::npos) << host_config;
}

// An explicit kernel that cannot run on the backend's device is refused at set-up (exit 2), naming
// the kernels that can, before the run directory exists and before the GEMM probe (no
// trainer.peak_flops here: a run that got that far would probe).
TEST(DeviceRunAttention, AKernelOnAnotherDeviceIsRefusedBeforeTheRunStarts) {
  const fs::path run = scratch("flash-on-guarded");
  const CommandResult r =
      run_command({LOOM_BINARY, "train", kSource + "/configs/quickstart.yaml", "backend.type=guarded",
                   "model.attention=flash", "trainer.run_dir=" + run.string()},
                  env());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("model.attention: the attention kernel 'flash' computes on host, but backend 'guarded' keeps "
                       "its tensors on guarded:0; attention kernels that compute there: guarded"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run)) << "the run directory was created";
  EXPECT_EQ((r.out + r.err).find("GEMM probe"), std::string::npos) << r.out << r.err;

  // The other way round: the device's kernel with a host backend, named with the host's kernels.
  const CommandResult h =
      run_command({LOOM_BINARY, "train", kSource + "/configs/quickstart.yaml", "backend.type=reference",
                   "model.attention=guarded", "trainer.run_dir=" + scratch("guarded-on-host").string()},
                  env());
  EXPECT_EQ(h.exit_code, 2) << h.out << h.err;
  EXPECT_NE(h.err.find("the attention kernel 'guarded' computes on guarded:0, but backend 'reference' keeps its "
                       "tensors on host; attention kernels that compute there: flash, naive"),
            std::string::npos)
      << h.err;
}

// `loom bench attention`: auto is the host's kernel; a device's kernel is measured on copies of
// the problem in its memory (the guarded device faults on any host access: exit 139 otherwise),
// its memory columns "-" (its scratch is not the core allocator's).
TEST(DeviceRunAttention, TheBenchmarkResolvesAutoOnTheHostAndMeasuresADevicesKernelOnItsMemory) {
  const CommandResult r = run_command({LOOM_BINARY, "bench", "attention", "--kernels", "auto", "--seq-lens", "16",
                                       "--batch", "1", "--heads", "2", "--head-dim", "8", "--repeats", "1"},
                                      env());
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("flash"), std::string::npos) << r.out;
  const CommandResult g = run_command(
      {LOOM_BINARY, "bench", "attention", "--kernels", "naive,guarded", "--dtypes", "f32,bf16", "--seq-lens", "16,24",
       "--batch", "1", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--repeats", "2"},
      env());
  ASSERT_EQ(g.exit_code, 0) << g.out << g.err;
  for (const char* text : {"seq_len 16 ", "seq_len 24 ", "  naive ", "  guarded on guarded:0 "})
    EXPECT_NE(g.out.find(text), std::string::npos) << text << " missing from\n" << g.out;
  // The guarded row's peak-memory and memory-ratio columns are "-"; naive's are numbers.
  std::istringstream lines(g.out);
  int guarded_rows = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.find("guarded on guarded:0") == std::string::npos) continue;
    ++guarded_rows;
    std::istringstream fields(line.substr(line.find("guarded:0") + 9));
    std::vector<std::string> f{std::istream_iterator<std::string>(fields), {}};
    if (!f.empty() && f.front() == "(fallback)") f.erase(f.begin());  // bf16: naive's arithmetic is float32
    ASSERT_EQ(f.size(), 8u) << line;  // dtype, fwd, fwd+bwd, MiB, two speeds, memory, vs f32
    EXPECT_EQ(f[3], "-") << line;
    EXPECT_EQ(f[6], "-") << line;
    EXPECT_GT(std::stod(f[2]), 0.0) << line;
  }
  EXPECT_EQ(guarded_rows, 4) << g.out;  // two lengths, two dtypes
}

// The memory check (trainer.memory_check) compares the estimate with the device's free memory
// when the backend's buffer type reports one (BufferType::memory, a GPU's cudaMemGetInfo; the
// guarded device's `free_memory` option here), not with the host's: refused before anything is
// written, naming the device.
TEST(DeviceRunMemory, TheMemoryCheckReadsTheDevicesFreeMemory) {
  const Recipe quickstart{"quickstart", "quickstart.yaml", {"backend.free_memory=1000000"}};
  const fs::path run_dir = scratch("memory-check");
  const CommandResult r = run_command(train_args(quickstart, "guarded", run_dir), env());
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("the run needs about "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("1 MiB is available (guarded:0 free memory 1 MiB of 1.00 GiB)"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_dir));
}

}  // namespace
