// `loom conformance PLUGIN.so` as a plugin author runs it, on plugins of this build: the suites of
// the plugin's kinds only, against the oracles, with GoogleTest's report and exit status; and the
// plugins it cannot check (exit status 2, saying why).
#include <gtest/gtest.h>

#include <string>

#include "../core/test_support.hpp"

namespace {

using loom::test::run_command;

loom::test::CommandResult loom_conformance(std::vector<std::string> args) {
  args.insert(args.begin(), {LOOM_BINARY, "conformance"});
  return run_command(args, {"LOOM_PLUGIN_PATH="});
}

std::string plugin(const std::string& kind_and_name) {
  return std::string(LOOM_PLUGIN_DIR) + "/libloom-" + kind_and_name + ".so";
}

TEST(ConformanceCommand, RunsTheAttentionSuiteOnAnAttentionPlugin) {
  const auto r = loom_conformance({plugin("attention-flash")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(attention/flash)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("libloom-attention-naive.so"), std::string::npos) << "the oracle is named\n" << r.out;
  EXPECT_NE(r.out.find("AttentionConformance.EveryKernelMatchesNaive"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[ kernel   ] flash block_q=4 block_kv=4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[  PASSED  ]"), std::string::npos) << r.out;
  // Only the suite of its kind, and not the checks of loom's own build.
  EXPECT_EQ(r.out.find("[ RUN      ] Registered/BackendConformance"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[ RUN      ] EveryOptimizer"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[ RUN      ] AttentionConformance.BuildRegistersTheShippedKernels"), std::string::npos)
      << r.out;
}

TEST(ConformanceCommand, RunsTheBackendSuitesOnADeviceBackend) {
  // The test device `guarded` (a backend and its attention kernel, memory the host cannot touch).
  const auto r = loom_conformance({std::string(LOOM_FIXTURE_DIR) + "/devices/libloom-test-guarded.so"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(backend/guarded, attention/guarded)"), std::string::npos) << r.out;
  for (const char* test : {"[       OK ] Registered/BackendConformance.MatchesReference/guarded_attention_causal_gqa",
                           "[       OK ] Registered/KernelContract.OverwrittenOutputsAreNeverRead/guarded",
                           "[       OK ] Operations/Determinism.RepeatedRunsAreBitIdentical/linear"})
    EXPECT_NE(r.out.find(test), std::string::npos) << test << " missing from\n" << r.out;
  // Only the plugin's backend is under test, against the oracle.
  EXPECT_EQ(r.out.find("MatchesReference/cpu_"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("KernelContract.OverwrittenOutputsAreNeverRead/reference"), std::string::npos) << r.out;
}

// A backend whose device this machine lacks (its creation throws DeviceUnavailable: the cuda
// backend without a GPU) is not failed: every case is skipped, saying why, and the run passes.
TEST(ConformanceCommand, SkipsEveryCaseOfABackendWhoseDeviceIsNotHere) {
  const auto r = loom_conformance({std::string(LOOM_FIXTURE_DIR) + "/absent_device/libloom-test-absent-device.so"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(backend/absent_device)"), std::string::npos) << r.out;
  // Each suite's cases ran and were skipped with the backend's message.
  for (const char* test : {"[  SKIPPED ] Registered/BackendConformance.MatchesReference/absent_device_linear",
                           "[  SKIPPED ] Registered/KernelContract.OverwrittenOutputsAreNeverRead/absent_device",
                           "[  SKIPPED ] Operations/Determinism.RepeatedRunsAreBitIdentical/linear"})
    EXPECT_NE(r.out.find(test), std::string::npos) << test << " missing from\n" << r.out;
  EXPECT_NE(r.out.find("its device is not present on this machine"), std::string::npos) << r.out;
  // Nothing passed or failed: all of them skipped.
  EXPECT_EQ(r.out.find("[       OK ]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[  FAILED  ]"), std::string::npos) << r.out;
  const auto ran = r.out.find("[==========] ");
  const auto skipped = r.out.find("[  SKIPPED ] ", r.out.rfind("[  PASSED  ]"));
  ASSERT_NE(ran, std::string::npos) << r.out;
  ASSERT_NE(skipped, std::string::npos) << r.out;
  const long total = std::stol(r.out.substr(r.out.find("Running ", ran) + 8));
  const long skipped_count = std::stol(r.out.substr(skipped + 13));
  EXPECT_GT(total, 100);
  EXPECT_EQ(skipped_count, total) << r.out;
}

TEST(ConformanceCommand, ReplaysPyTorchForAnOptimizerItRecorded) {
  const auto r = loom_conformance({plugin("optimizer-sgd"), "--gtest_filter=*AgreesWithPyTorch*:*ZeroLearning*"});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("Registered/AgreesWithPyTorch.StepByStep/sgd"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("EveryOptimizer.ZeroLearningRateLeavesParametersUnchanged"), std::string::npos) << r.out;
}

TEST(ConformanceCommand, RunsTheCollectiveSuiteOnACollective) {
  // One process here; tests/distributed runs it on `mpi` under `mpirun -np 4`.
  const auto r = loom_conformance({plugin("collective-single")});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("(collective/single)"), std::string::npos) << r.out;
  for (const char* test :
       {"[       OK ] CollectiveConformance.EveryOperationWorksOnEveryGroup",
        "[       OK ] CollectiveConformance.GroupReductionsAreTheSameBitsOnEveryRankAndGroupAndRepeat"})
    EXPECT_NE(r.out.find(test), std::string::npos) << test << " missing from\n" << r.out;
  EXPECT_EQ(r.out.find("[ RUN      ] EveryOptimizer"), std::string::npos) << r.out;
}

TEST(ConformanceCommand, FailsAKernelThatBreaksTheContract) {
  // test_unmasked ignores the causal mask, windows and segment ids.
  const auto r = loom_conformance({std::string(LOOM_FIXTURE_DIR) + "/conformance/libloom-test-unmasked.so",
                                   "--gtest_filter=AttentionConformance.EveryKernelMatchesNaive"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("[  FAILED  ] AttentionConformance.EveryKernelMatchesNaive"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("causal"), std::string::npos) << "the failing case is described\n" << r.out;
  // Failure lines cite the suite's source relative to loom's source tree, not a path of the
  // machine loom was built on.
  EXPECT_NE(r.out.find("\ntests/conformance/attention_test.cpp:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("/tests/conformance/attention_test.cpp"), std::string::npos) << r.out;
}

TEST(ConformanceCommand, RefusesWhatItCannotCheck) {
  auto r = loom_conformance({"/no/such/libloom-x.so"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("/no/such/libloom-x.so: no such plugin file"), std::string::npos) << r.err;

  r = loom_conformance({plugin("tokenizer-byte")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("provides tokenizer/byte; conformance suites exist for backends, attention kernels, "
                       "optimizers and collectives"),
            std::string::npos)
      << r.err;

  r = loom_conformance({std::string(LOOM_FIXTURE_DIR) + "/broken/libloom-test-text.so"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("failed to load"), std::string::npos) << r.err;

  r = loom_conformance({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("usage: loom conformance PLUGIN.so"), std::string::npos) << r.out;
}

}  // namespace
