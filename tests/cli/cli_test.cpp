// The loom command as a user runs it: output, messages and exit codes (0 ok, 2 user error,
// 1 internal error).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../core/test_support.hpp"
#include "loom/core/plugin_host.hpp"

namespace loom {
namespace {

using test::fixture_dir;
using test::run_command;

// Runs loom with only the given plugin directories (the built-in ones too, since they sit next
// to the executable; these tests only look for the test components).
test::CommandResult loom(std::vector<std::string> args, std::vector<std::string> env = {}) {
  args.insert(args.begin(), LOOM_BINARY);
  env.push_back("LOOM_PLUGIN_PATH=");
  return run_command(args, env);
}

TEST(Cli, HelpAndVersionExitZero) {
  auto r = loom({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("plugins"), std::string::npos);
  EXPECT_NE(r.out.find("config"), std::string::npos);
  r = loom({"plugins", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--plugin-path"), std::string::npos);
  EXPECT_EQ(loom({"--version"}).exit_code, 0);
}

TEST(Cli, NoCommandOrUnknownCommandIsAUserError) {
  EXPECT_EQ(loom({}).exit_code, 2);
  const auto r = loom({"plugin"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err, "loom: error: unknown command 'plugin'; did you mean 'plugins'? (run `loom --help` for the list)\n");
}

TEST(Cli, UnknownFlagIsAUserError) {
  const auto r = loom({"plugins", "--jsn"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("loom: error: "), std::string::npos);
  EXPECT_NE(r.err.find("jsn"), std::string::npos);
}

TEST(Cli, PluginsListsComponentsAndFailures) {
  const auto r =
      loom({"plugins", "--plugin-path", fixture_dir("good").string(), "--plugin-path", fixture_dir("broken").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("test_scaled"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a test schedule with options of every type"), std::string::npos);
  EXPECT_NE(r.out.find("libloom-test-good.so"), std::string::npos);
  EXPECT_NE(r.out.find("plugins that failed to load:"), std::string::npos);
  EXPECT_NE(r.out.find("not an ELF shared object"), std::string::npos);
  EXPECT_NE(r.out.find("ABI mismatch"), std::string::npos);
}

// A plugin whose option defaults outside its own range is listed as failed, naming the option,
// and a config that selects its component is refused with that reason, not blamed on the config.
TEST(Cli, APluginWithADefaultItsOptionRefusesIsListedAsFailed) {
  const std::string dir = fixture_dir("bad_default").string();
  auto r = loom({"plugins", "--no-default-plugin-path", "--plugin-path", dir});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("plugins that failed to load:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr_schedule 'test_bad_default' declares the option 'beta' with the default 1.5"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("test_valid_defaults"), std::string::npos) << r.out;

  test::TempDir work;
  const auto file = work.write("run.yaml", "lr_schedule: test_bad_default\n");
  r = loom({"config", "show", file.string(), "--plugin-path", dir});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.err.find("unknown lr_schedule 'test_bad_default'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("plugins that failed to load:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("declares the option 'beta' with the default 1.5"), std::string::npos) << r.err;
}

TEST(Cli, PluginsStrictExitsOneWhenAPluginFailed) {
  // Without --strict a failed plugin is listed, and the command succeeds (a run fails only when
  // it needs that plugin); with it, scripts get status 1.
  const std::vector<std::string> path = {"--plugin-path", fixture_dir("good").string(), "--plugin-path",
                                         fixture_dir("broken").string()};
  auto args = path;
  args.insert(args.begin(), {"plugins", "--strict"});
  auto r = loom(args);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.out.find("plugins that failed to load:"), std::string::npos) << r.out;
  EXPECT_EQ(r.err, "loom: 11 plugins failed to load (--strict)\n");
  args.push_back("--json");
  EXPECT_EQ(loom(args).exit_code, 1);
  r = loom({"plugins", "--strict", "--plugin-path", fixture_dir("good").string()});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.err, "");
  r = loom({"plugins", "--help"});
  EXPECT_NE(r.out.find("--strict"), std::string::npos) << r.out;
}

// What tests/cli/cpu_check_program.cpp claims beyond x86-64-v4.
const std::vector<const char*> claimed_extensions = {"avx512fp16", "amx-tile", "avx512vp2intersect"};

TEST(Cli, AProgramBuiltForExtensionsThisCpuLacksSaysSoInsteadOfCrashing) {
  // cpu_check_program carries loom's start-up check and claims extensions no known CPU has
  // together; `loom` itself passes the check here (every other test runs it).
  const std::vector<std::string> cpu = host_cpu_features();
  if (std::all_of(claimed_extensions.begin(), claimed_extensions.end(),
                  [&](const char* f) { return std::find(cpu.begin(), cpu.end(), f) != cpu.end(); }))
    GTEST_SKIP() << "this CPU has every extension the program claims";
  const auto r = run_command({LOOM_CPU_CHECK_PROGRAM});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_EQ(r.out, "") << "main must not run";
  EXPECT_NE(r.err.find("cpu_check_program: error: this CPU lacks "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(", which this build needs (it is built for x86-64-v4+avx512fp16+amx-tile+avx512vp2intersect; "
                       "this CPU is x86-64-v"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("build loom for this CPU: cmake -DLOOM_ARCH=x86-64-v"), std::string::npos) << r.err;
}

TEST(Cli, PluginsJsonIsValidAndComplete) {
  const auto r = loom({"plugins", "--json"},
                      {"LOOM_PLUGIN_PATH=" + fixture_dir("good").string() + ":" + fixture_dir("broken").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  bool found = false;
  for (const auto& c : doc["components"])
    if (c["kind"] == "tokenizer" && c["name"] == "test_bytes") {
      found = true;
      EXPECT_EQ(c["version"], "0.0.1");
      EXPECT_NE(c["plugin"].get<std::string>().find("libloom-test-good.so"), std::string::npos);
    }
  EXPECT_TRUE(found);
  int failed = 0;
  for (const auto& p : doc["plugins"]) failed += p["status"] == "failed";
  EXPECT_EQ(failed, 11);
  EXPECT_EQ(doc["plugin_path"][0], fixture_dir("good").string() + " (LOOM_PLUGIN_PATH)");
}

TEST(Cli, ConfigShowPrintsTheResolvedConfigWithDefaults) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "lr_schedule:\n  type: test_scaled\n  scale: 0.5\n");
  const auto r = loom(
      {"config", "show", file.string(), "lr_schedule.hold_steps=7", "--plugin-path", fixture_dir("good").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("lr_schedule:\n  type: test_scaled\n  scale: 0.5\n  hold_steps: 7\n  verbose: false\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("  tokenizer:\n    type: test_bytes\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model: null"), std::string::npos) << r.out;
}

TEST(Cli, ChangingAComponentsTypeFromTheCommandLineDropsTheOldTypesOptionsWithANote) {
  const std::string quickstart = std::string(LOOM_SOURCE_DIR) + "/configs/quickstart.yaml";
  auto r = loom({"config", "show", quickstart, "data.type=text", "data.paths=[corpus.txt]"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("# note: data: command-line override 'data.type=text' changed the type from 'synthetic' to "
                        "'text', so the options earlier layers gave 'synthetic' were dropped: num_documents (" +
                            quickstart + ":14:18)\n",
                        0),
            0u)
      << r.out;
  EXPECT_NE(r.out.find("data:\n  type: text\n  paths: [corpus.txt]\n"), std::string::npos) << r.out;

  // An out-of-tree optimizer tried on a config written for adamw: adamw's beta2 goes.
  r = loom({"config", "show", quickstart, "optimizer.type=sgd"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("# note: optimizer: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer:\n  type: sgd\n"), std::string::npos) << r.out;

  // Each override is a layer: paths given before the type belong to the old type.
  r = loom({"config", "show", quickstart, "data.paths=[corpus.txt]", "data.type=text"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data: missing required option 'paths'"), std::string::npos) << r.err;
  // A typo is still an error.
  r = loom({"config", "show", quickstart, "data.type=text", "data.path=[corpus.txt]"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("data.path: unknown option of dataset 'text'; did you mean 'paths'?"), std::string::npos)
      << r.err;
}

// learning_rate and max_grad_norm are the optimizer section's, read by the trainer whichever
// optimizer it names: changing the type keeps them (the note lists only adamw's own options).
TEST(Cli, ChangingTheOptimizersTypeKeepsTheSectionsLearningRate) {
  const std::string quickstart = std::string(LOOM_SOURCE_DIR) + "/configs/quickstart.yaml";
  auto r = loom({"config", "show", quickstart, "optimizer.learning_rate=1e-3", "optimizer.max_grad_norm=0.5",
                 "optimizer.type=sgd"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("optimizer:\n  type: sgd\n  learning_rate: 0.001\n  max_grad_norm: 0.5\n"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("the options earlier layers gave 'adamw' were dropped: beta2 ("), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("dropped: learning_rate"), std::string::npos) << r.out;
  // The file's own rate survives a bare name too.
  r = loom({"config", "show", quickstart, "optimizer=sgd"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("optimizer:\n  type: sgd\n  learning_rate: 0.002\n"), std::string::npos) << r.out;
}

TEST(Cli, ARunShorterThanTheWarmupRunsWithOneWarning) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml",
                              "model: {type: gpt2, seq_len: 16, hidden_dim: 16, num_layers: 1, num_heads: 2}\n"
                              "tokenizer: byte\n"
                              "data: {type: synthetic, num_documents: 50}\n"
                              "lr_schedule: {type: cosine, warmup: 50}\n"
                              "trainer: {num_train_steps: 400, train_batch_size: 2, sample_length: 4}\n");
  const auto r =
      loom({"train", file.string(), "trainer.num_train_steps=3", "trainer.run_dir=" + (dir.path() / "run").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const std::string expected = "warning: " + file.string() +
                               ":4:37: lr_schedule.warmup: 50 steps do not fit in the run of 3 steps; clamped to 3";
  EXPECT_NE(r.out.find(expected), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("warning: "), r.out.rfind("warning: ")) << r.out;  // one line
  EXPECT_NE(r.out.find("done: 3 steps"), std::string::npos) << r.out;
}

// The start-up memory estimate (docs/training.md, "Memory estimate"): in the header, and a run
// it says cannot fit is refused before anything is allocated or written.
std::string memory_test_config(test::TempDir& dir) {
  return dir
      .write("run.yaml",
             "model: {type: gpt2, seq_len: 128, hidden_dim: 128, num_layers: 4, num_heads: 4, attention: flash}\n"
             "tokenizer: byte\n"
             "data: {type: synthetic, num_documents: 2000}\n"
             "trainer: {num_train_steps: 2, train_batch_size: 64, sample_length: 0, steps_per_eval: 1000, "
             "max_eval_batches: 1, save_final: false}\n")
      .string();
}

double estimate_mib(const std::string& out) {
  const auto at = out.find("memory estimate per rank: ");
  if (at == std::string::npos) return -1;
  std::istringstream in(out.substr(at + 26));
  double value = 0;
  std::string unit;
  in >> value >> unit;
  return unit.starts_with("GiB") ? value * 1024 : value;
}

TEST(Cli, TheMemoryEstimateIsInTheHeaderAndWithinAQuarterOfThePeakRss) {
  test::TempDir dir;
  const auto file = memory_test_config(dir);
  const auto r = loom({"train", file, "trainer.run_dir=" + (dir.path() / "run").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err << r.out;
  const double estimate = estimate_mib(r.out);
  ASSERT_GT(estimate, 0) << r.out;
  const double rss = static_cast<double>(r.peak_rss_kib) / 1024.0;
  EXPECT_NEAR(estimate / rss, 1.0, 0.25) << "estimate " << estimate << " MiB, peak RSS " << rss << " MiB\n" << r.out;
}

TEST(Cli, ARunThatCannotFitIsRefusedBeforeAnythingIsAllocated) {
  test::TempDir dir;
  const auto file = memory_test_config(dir);
  const auto run_dir = dir.path() / "run";
  auto r = loom({"train", file, "trainer.run_dir=" + run_dir.string()}, {"LOOM_MEMORY_AVAILABLE=300M"});
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_NE(r.err.find("the run needs about "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("300 MiB is available (LOOM_MEMORY_AVAILABLE"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("model.remat: full"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
  // Far below anything it could do: the figures, and no advice it cannot give.
  r = loom({"train", file, "trainer.run_dir=" + run_dir.string()}, {"LOOM_MEMORY_AVAILABLE=1M"});
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_NE(r.err.find("Nothing this estimate knows of would make it fit"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
  // Users who know better.
  r = loom(
      {"train", file, "trainer.run_dir=" + run_dir.string(), "trainer.memory_check=warn", "trainer.num_train_steps=1"},
      {"LOOM_MEMORY_AVAILABLE=300M"});
  EXPECT_EQ(r.exit_code, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("warning: the run needs about "), std::string::npos) << r.out;
}

// Shapes no machine could hold are user errors (exit 2) with the option and its range, or the
// memory estimate's refusal with its figures: never an internal error ("negative extent") or a
// std::bad_alloc (exit 1).
TEST(Cli, AbsurdModelShapesAreUserErrors) {
  test::TempDir dir;
  const auto file = memory_test_config(dir);
  const auto run_dir = dir.path() / "run";
  for (const std::string option : {"model.hidden_dim=4611686018427387904", "model.num_layers=1e15"}) {
    const auto r = loom({"train", file, "trainer.run_dir=" + run_dir.string(), option});
    EXPECT_EQ(r.exit_code, 2) << option << "\n" << r.err << r.out;
    EXPECT_NE(r.err.find(option.substr(0, option.find('='))), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << r.err;
  }
  // Within each option's range, but together more values than 64 bits count.
  auto r = loom({"train", file, "trainer.run_dir=" + run_dir.string(), "model.hidden_dim=1048576",
                 "model.num_heads=4096", "model.num_layers=16384"});
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_NE(r.err.find("more than 2^56 parameter values"), std::string::npos) << r.err;
  // Countable, and far larger than the machine: the estimate's refusal.
  r = loom({"train", file, "trainer.run_dir=" + run_dir.string(), "model.hidden_dim=65536", "model.num_heads=512",
            "model.num_layers=1024"},
           {"LOOM_MEMORY_AVAILABLE=8G"});
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  EXPECT_NE(r.err.find("the run needs about "), std::string::npos) << r.err;
}

// A backend whose device this machine lacks (the cuda backend without a GPU; here the fixture
// absent_device, on every machine): one message saying so, exit 2, and nothing written, not even
// the run directory (the backend is created before it).
TEST(Cli, ABackendWhoseDeviceIsNotHereIsRefusedBeforeTheRunDirectory) {
  test::TempDir dir;
  const auto file = memory_test_config(dir);
  const auto run_dir = dir.path() / "run";
  const auto r = loom({"train", file, "backend.type=absent_device", "trainer.run_dir=" + run_dir.string(),
                       "--plugin-path", fixture_dir("absent_device").string()});
  EXPECT_EQ(r.exit_code, 2) << r.err << r.out;
  const std::string message = "backend absent_device: its device is not present on this machine";
  EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(message), r.err.rfind(message)) << "said once\n" << r.err;
  EXPECT_FALSE(std::filesystem::exists(run_dir));
}

// Under a launcher other than OpenMPI's mpirun, each process would train alone, all of them on one
// run directory: loom refuses, naming what it saw, before it touches the run directory.
TEST(Cli, TrainUnderALauncherOtherThanOpenMpiIsRefusedNamingIt) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml",
                              "model: {type: gpt2, seq_len: 16, hidden_dim: 16, num_layers: 1, num_heads: 2}\n"
                              "tokenizer: byte\n"
                              "data: {type: synthetic, num_documents: 50}\n"
                              "lr_schedule: {type: cosine, warmup: 0}\n"
                              "trainer: {num_train_steps: 1, train_batch_size: 2, sample_length: 0, "
                              "steps_per_eval: 0, max_eval_batches: 1, trackers: [jsonl]}\n");
  const std::string run_dir = "trainer.run_dir=" + (dir.path() / "run").string();
  const struct {
    std::vector<std::string> env;
    std::string seen;
  } launchers[] = {
      {{"PMI_RANK=1", "PMI_SIZE=3"},
       "MPICH's or Intel MPI's mpiexec, or another PMI launcher (PMI_RANK=1, PMI_SIZE=3) "
       "started this process, one of 3"},
      {{"SLURM_PROCID=2", "SLURM_STEP_NUM_TASKS=4"}, "Slurm's srun (SLURM_PROCID=2, SLURM_STEP_NUM_TASKS=4)"},
      {{"PMIX_RANK=0"}, "a PMIx launcher (PMIX_RANK=0)"},
      {{"PMIX_RANK=1", "SLURM_STEP_NUM_TASKS=2"}, "Slurm's srun over PMIx (PMIX_RANK=1, SLURM_STEP_NUM_TASKS=2)"},
  };
  for (const auto& l : launchers) {
    const auto r = loom({"train", file.string(), run_dir}, l.env);
    EXPECT_EQ(r.exit_code, 2) << l.seen << "\n" << r.out << r.err;
    EXPECT_EQ(r.err.rfind("loom: error: " + l.seen, 0), 0u) << r.err;
    EXPECT_NE(r.err.find("needs OpenMPI's mpirun"), std::string::npos) << r.err;
    EXPECT_FALSE(std::filesystem::exists(dir.path() / "run")) << l.seen;
  }
  // Naming a collective that connects fewer processes than the launcher started is refused too.
  auto r = loom({"train", file.string(), run_dir, "collective=single"}, {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=2"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("collective `single` connects 1 process, but Slurm's srun (SLURM_PROCID=0, "
                       "SLURM_STEP_NUM_TASKS=2) started 2"),
            std::string::npos)
      << r.err;
  // One task of srun, or a batch script's environment (SLURM_NTASKS without a step), trains.
  r = loom({"train", file.string(), run_dir}, {"SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  r = loom({"train", file.string(), run_dir + "2"}, {"SLURM_PROCID=0", "SLURM_NTASKS=4"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
}

TEST(Cli, ConfigErrorsExitTwoWithFileAndLine) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "lr_schedule:\n  type: test_scaled\n  hold_step: 7\n");
  const auto r = loom({"config", "show", file.string(), "--plugin-path", fixture_dir("good").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("loom: error: while validating " + file.string() + ": " + file.string() +
                       ":3:14: lr_schedule.hold_step: unknown option of lr_schedule 'test_scaled'; did you mean "
                       "'hold_steps'?"),
            std::string::npos)
      << r.err;
  // One message, no stack of exceptions.
  EXPECT_EQ(r.err.rfind("loom: ", 0), 0u);
  EXPECT_EQ(r.err.find("loom: ", 1), std::string::npos);
}

TEST(Cli, UnknownTopLevelSectionIsAnError) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "optimiser:\n  type: adamw\n");
  const auto r = loom({"config", "show", file.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(file.string() + ":2:3: optimiser: unknown option; did you mean 'optimizer'?"), std::string::npos)
      << r.err;
}

TEST(Cli, UnknownTypeListsTheAvailableNamesAndFailedPlugins) {
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "tokenizer: test_byts\n");
  const auto r = loom({"config", "show", file.string()},
                      {"LOOM_PLUGIN_PATH=" + fixture_dir("good").string() + ":" + fixture_dir("broken").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(file.string() + ":1:12: tokenizer: unknown tokenizer 'test_byts'; did you mean 'test_bytes'?"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("available tokenizers:\n"), std::string::npos) << r.err;
  // Names are padded to the longest name listed, then the file.
  const auto line_at = r.err.find("\n  test_bytes ");
  ASSERT_NE(line_at, std::string::npos) << r.err;
  const std::string line = r.err.substr(line_at + 1, r.err.find('\n', line_at + 1) - line_at - 1);
  EXPECT_NE(line.find(" " + std::filesystem::canonical(fixture_dir("good") / "libloom-test-good.so").string()),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("plugin path searched:\n  " + fixture_dir("good").string() + " (LOOM_PLUGIN_PATH)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("plugins that failed to load:"), std::string::npos) << r.err;
}

TEST(Cli, MissingConfigFileAndBadOverrideExitTwo) {
  auto r = loom({"config", "show", "/nonexistent.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("config file '/nonexistent.yaml' does not exist"), std::string::npos) << r.err;
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "{}\n");
  r = loom({"config", "show", file.string(), "a..b=1"});
  EXPECT_EQ(r.exit_code, 2);
  r = loom({"config", "show"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no config file given"), std::string::npos);
  r = loom({"config", "shwo"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'show'?"), std::string::npos);
}

TEST(Cli, TrainAndGenerateRefuseBadInputWithStatusTwo) {
  auto r = loom({"train"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("no config file given"), std::string::npos) << r.err;
  r = loom({"train", "/nonexistent/run.yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("does not exist"), std::string::npos) << r.err;
  test::TempDir dir;
  const auto file = dir.write("run.yaml", "trainer:\n  num_train_step: 10\n");
  r = loom({"train", file.string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find(file.string() + ":2:19: trainer.num_train_step: unknown option of trainer; did you mean "
                                       "'num_train_steps'?"),
            std::string::npos)
      << r.err;
  r = loom({"generate", dir.path().string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("is not a loom run"), std::string::npos) << r.err;
  r = loom({"generate"});
  EXPECT_EQ(r.exit_code, 2);
}

// A run small enough to train in a second: context 32, byte tokenizer, no samples.
const char* tiny_run_config = R"(
model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 1, num_heads: 2}
tokenizer: byte
data: {type: synthetic, num_documents: 200}
optimizer: {type: adamw, learning_rate: 3.0e-3}
lr_schedule: {type: cosine, warmup: 1}
trainer: {num_train_steps: 2, train_batch_size: 2, max_eval_batches: 1, sample_length: 0, trackers: [],
          peak_flops: 1.0e9}
)";

TEST(Cli, GenerateGoesPastTheContextOrStopsWithAMessage) {
  test::TempDir dir;
  const auto file = dir.write("tiny.yaml", tiny_run_config);
  const std::string run = (dir.path() / "run").string();
  auto r = loom({"train", file.string(), "trainer.run_dir=" + run});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // 200 bytes of the byte tokenizer and the final newline, past the context of 32.
  r = loom({"generate", run, "-n", "200"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.size(), 201u) << r.out;
  r = loom({"generate", run, "-n", "200", "--prompt", "The ", "--stop-at-context"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The prompt's 4 tokens and 28 new ones fill the context; the 29th is predicted at its end.
  EXPECT_EQ(r.out.size(), 4u + 29u + 1u) << r.out;
  EXPECT_NE(r.err.find("stopped after 29 of 200 tokens: the model's context of 32 tokens is full (--stop-at-context"),
            std::string::npos)
      << r.err;
}

TEST(Cli, SamplingOptionsOutOfRangeAreUserErrors) {
  test::TempDir dir;
  // Checked before the run is read: the run need not exist.
  const std::string run = dir.path().string();
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--top-k", "-3"}, "--top-k (-k) must be at least 0 (0: every token), got -3"},
      {{"--top-p", "0"}, "--top-p must be in (0, 1] (1: every token), got 0"},
      {{"--top-p", "1.5"}, "--top-p must be in (0, 1] (1: every token), got 1.5"},
      {{"--temperature", "-1"}, "--temperature (-t) must be a number >= 0 (0: greedy), got -1"},
      {{"-n", "-1"}, "--max-new-tokens (-n) must be at least 0, got -1"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {"generate", run};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto r = loom(argv);
    EXPECT_EQ(r.exit_code, 2) << args[0] << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  // The trainer's sample_* options, checked with the config.
  const auto file = dir.write("tiny.yaml", tiny_run_config);
  const std::vector<std::pair<std::string, std::string>> trainer_cases = {
      {"trainer.sample_top_k=-3", "trainer.sample_top_k"},
      {"trainer.sample_top_p=0", "trainer.sample_top_p"},
      {"trainer.sample_top_p=1.5", "trainer.sample_top_p"},
      {"trainer.sample_temperature=-1", "trainer.sample_temperature"},
      {"trainer.sample_length=-1", "trainer.sample_length"},
  };
  for (const auto& [override_, option] : trainer_cases) {
    const auto r = loom({"train", file.string(), override_, "trainer.run_dir=" + (dir.path() / "never").string()});
    EXPECT_EQ(r.exit_code, 2) << override_ << ": " << r.err;
    EXPECT_NE(r.err.find(option), std::string::npos) << r.err;
  }
}

// trainer.mesh on one process: a mesh of more ranks, two free axes, a size of 0, an axis that
// does not exist; each one user error (status 2) before the run directory is made.
TEST(Cli, AMeshThatDoesNotFitTheRanksIsRefusedBeforeTheRunStarts) {
  test::TempDir dir;
  const auto file = dir.write("tiny.yaml", tiny_run_config);
  const auto never = dir.path() / "never";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"trainer.mesh={data: 1, fsdp: 2}",
       "trainer.mesh {data: 1, fsdp: 2, tensor: 1} has 2 ranks but the run has 1 rank: the sizes of the axes must "
       "multiply to "
       "the number of ranks (mpirun -np), or one may be -1 for the ranks the others leave"},
      {"trainer.mesh.data=2", "trainer.mesh {data: 2, fsdp: 1, tensor: 1} has 2 ranks but the run has 1 rank"},
      {"trainer.mesh={data: -1, fsdp: -1}", "only one axis may be -1"},
      {"trainer.mesh.fsdp=0", "trainer.mesh.fsdp is 0: each axis of the mesh is a number of ranks"},
      {"trainer.mesh.data=-2", "trainer.mesh.data"},
      {"trainer.mesh.tensor=2", "trainer.mesh {data: -1, fsdp: 1, tensor: 2} does not divide the 1 rank of this run"},
      {"trainer.mesh.pipeline=2", "trainer.mesh.pipeline: unknown option"},
  };
  for (const auto& [override_, message] : cases) {
    const auto r = loom({"train", file.string(), override_, "trainer.run_dir=" + never.string()});
    EXPECT_EQ(r.exit_code, 2) << override_ << ": " << r.err;
    EXPECT_NE(r.err.find(message), std::string::npos) << override_ << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(never)) << override_;
  }
  // The default, written out, and fsdp -1 (one rank) train as before.
  auto r = loom({"train", file.string(), "trainer.mesh={data: -1, fsdp: -1}", "trainer.mesh.data=1",
                 "trainer.run_dir=" + (dir.path() / "ok").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// Mesh sizes beyond an int used to wrap (fsdp 4294967297 trained as fsdp 1, tensor 4294967295
// read as -1): each axis is range-checked as every option is, exit 2 naming the file and line.
TEST(Cli, MeshSizesBeyondTheirRangeAreRefusedWithFileAndLine) {
  test::TempDir dir;
  const auto never = dir.path() / "never";
  const auto file = dir.write("tiny.yaml", tiny_run_config);
  for (const auto& [override_, key] : std::vector<std::pair<std::string, std::string>>{
           {"trainer.mesh.fsdp=4294967297", "trainer.mesh.fsdp"},
           {"trainer.mesh={data: 1, fsdp: 4294967298}", "trainer.mesh.fsdp"},
           {"trainer.mesh.tensor=4294967295", "trainer.mesh.tensor"},
           {"trainer.mesh.data=1048577", "trainer.mesh.data"}}) {
    const auto r = loom({"train", file.string(), override_, "trainer.run_dir=" + never.string()});
    EXPECT_EQ(r.exit_code, 2) << override_ << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(key + ": expected an integer in [-1, 1048576], got "), std::string::npos)
        << override_ << ": " << r.err;
    EXPECT_NE(r.err.find("(out of range)"), std::string::npos) << override_ << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(never)) << override_;
  }
  // In a file: its line.
  const auto in_file = dir.write("mesh.yaml",
                                 "model: {type: gpt2, seq_len: 32, hidden_dim: 32, num_layers: 1, num_heads: 2}\n"
                                 "tokenizer: byte\n"
                                 "data: {type: synthetic, num_documents: 200}\n"
                                 "trainer:\n"
                                 "  num_train_steps: 2\n"
                                 "  mesh:\n"
                                 "    fsdp: 4294967297\n");
  const auto r = loom({"train", in_file.string(), "trainer.run_dir=" + never.string()});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find(in_file.string() + ":7:11: trainer.mesh.fsdp: expected an integer in [-1, 1048576], got "
                                          "4294967297 (out of range)"),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(std::filesystem::exists(never));
}

TEST(Cli, GenerateNamesAMissingRunItself) {
  test::TempDir dir;
  const std::string missing = (dir.path() / "runs" / "nope").string();
  auto r = loom({"generate", missing});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("'" + missing + "' does not exist"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find((dir.path() / "runs" / "config.yaml").string()), std::string::npos)
      << "the message names the parent's config: " << r.err;
}

TEST(Cli, ConfigSchemaPrintsDeclaredOptions) {
  auto r = loom({"config", "schema", "lr_schedule/test_scaled", "--plugin-path", fixture_dir("good").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("scale  a number in [0, 1]; default 0.1\n      Factor applied after the hold."),
            std::string::npos)
      << r.out;
  r = loom({"config", "schema", "--json", "--plugin-path", fixture_dir("good").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["sections"][0]["name"], "plugins");
  bool found = false;
  for (const auto& c : doc["components"])
    if (c["name"] == "test_scaled") {
      found = true;
      EXPECT_EQ(c["options"][0]["name"], "scale");
      EXPECT_EQ(c["options"][0]["max"]["value"], 1.0);
    }
  EXPECT_TRUE(found);
  r = loom({"config", "schema", "optimiser"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("did you mean 'optimizer'?"), std::string::npos);
  r = loom({"config", "schema", "lr_schedule/nope", "--plugin-path", fixture_dir("good").string()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown lr_schedule 'nope'"), std::string::npos);
}

}  // namespace
}  // namespace loom
