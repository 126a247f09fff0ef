// loom-conformance: the conformance suites run on one plugin, as `loom conformance PLUGIN.so`
// does (it runs this program, installed as <prefix>/lib/loom/loom-conformance).
//
//   loom-conformance PLUGIN.so [GoogleTest options]
//
// Loads the installed oracles (libloom-backend-reference.so and libloom-attention-naive.so from
// the plugin directory beside this program, <prefix>/lib/loom/plugins) and PLUGIN.so, and runs
// the suites of the kinds PLUGIN.so provides: backend (every operation against `reference`,
// values and gradients, the kernel contract, determinism), attention (against `naive`, with every
// integer option at its minimum too) and optimizer (the contract, and PyTorch's recorded
// trajectories from <prefix>/share/loom/conformance/optimizer for the algorithms they cover) and
// collective (every operation on the world and on the groups along each axis of every mesh of
// its ranks, determinism bit for bit; under `mpirun -np N` each rank runs this program).
// Exit status: 0 when every test passes, 1 when one fails, 2 when the plugin cannot be checked
// (missing, fails to load, provides no kind with a suite).
#include <gtest/gtest.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <filesystem>
#include <iostream>
#include <loom/core/plugin_host.hpp>
#include <loom/core/registry.hpp>
#include <set>
#include <string>
#include <vector>

#include "conformance_setup.hpp"
#include "loom/build_isa.hpp"
#include "numerics_test_support.hpp"

// Installed with loom, so it checks the CPU at start-up as `loom` does (apps/loom/cpu_check.cpp).
extern "C" const char loom_executable_isa[] = LOOM_BUILD_ISA;

namespace {

namespace fs = std::filesystem;

// GoogleTest filters of each kind's suites. Left out: checks of loom's own build (its shipped
// kernels and optimizers, the cpu backend's thread-count independence) and of the oracle alone
// (finite differences of `reference`).
const char* suite_filter(const std::string& kind) {
  if (kind == "backend") return "*BackendConformance.*:*KernelContract.*:*Determinism.RepeatedRunsAreBitIdentical*";
  if (kind == "attention") return "AttentionConformance.*";
  if (kind == "optimizer") return "EveryOptimizer.*:*AgreesWithPyTorch.*";
  if (kind == "collective") return "CollectiveConformance.*";
  return nullptr;
}
// The oracle's own kernel contract is loom's build's to check, not the plugin's.
constexpr const char* own_build_checks =
    "AttentionConformance.BuildRegistersTheShippedKernels:EveryOptimizer.TheBuildHasItsOptimizers:"
    "*KernelContract.*/reference";

int usage(std::ostream& out, int status) {
  out << "usage: loom conformance PLUGIN.so [GoogleTest options, e.g. --gtest_filter=...]\n\n"
         "Runs loom's conformance suites on the components PLUGIN.so registers: a backend against the\n"
         "`reference` backend, an attention kernel against `naive`, an optimizer against the contract\n"
         "and PyTorch's recorded trajectories, a collective against its contract on every mesh of its\n"
         "ranks (under `mpirun -np 4`). Exit status 0: every test passed; 1: a test failed; 2: the\n"
         "plugin could not be checked.\n";
  return status;
}

int run(int argc, char** argv) {
  std::vector<char*> args(argv, argv + argc);
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")
    return usage(argc < 2 ? std::cerr : std::cout, argc < 2 ? 2 : 0);
  const fs::path given = argv[1];
  args.erase(args.begin() + 1);
  std::error_code ec;
  if (!fs::is_regular_file(given, ec)) {
    std::cerr << "loom conformance: error: " << given.string() << ": no such plugin file\n";
    return 2;
  }

  // The installed layout: this program in <prefix>/lib/loom, the plugins in <prefix>/lib/loom/plugins,
  // the PyTorch trajectories in <prefix>/share/loom/conformance/optimizer (the build tree has the
  // same shape).
  const fs::path here = boost::dll::program_location().parent_path().string();
  loom::conformance::Setup& setup = loom::conformance::setup();
  setup.plugin_dir = here / "plugins";
  setup.torch_reference_dir = here.parent_path().parent_path() / "share" / "loom" / "conformance" / "optimizer";
  setup.subject = fs::canonical(given);
  for (const char* oracle : {"backend-reference", "attention-naive", "backend-cpu"})
    if (!fs::exists(loom::conformance::oracle_file(oracle))) {
      std::cerr << "loom conformance: error: " << loom::conformance::oracle_file(oracle).string()
                << " is missing: install loom with its built-in plugins\n";
      return 2;
    }

  // Which kinds the plugin provides decides the suites.
  loom::Registry probe;
  loom::PluginHost host;
  host.load(loom::conformance::plugins(), probe);
  const loom::PluginRecord* record = nullptr;
  for (const loom::PluginRecord& r : host.plugins())
    if (fs::path(r.file) == setup.subject) record = &r;
  if (record == nullptr || record->status != loom::PluginRecord::Status::loaded) {
    std::cerr << "loom conformance: error: " << setup.subject.string()
              << " failed to load: " << (record ? record->reason : std::string("not found by the plugin host")) << "\n";
    return 2;
  }
  std::set<std::string> kinds;
  std::string filter;
  for (const std::string& component : record->components) {
    const std::string kind = component.substr(0, component.find('/'));
    const char* f = suite_filter(kind);
    if (f != nullptr && kinds.insert(kind).second) filter += (filter.empty() ? "" : ":") + std::string(f);
  }
  std::string listed;
  for (const std::string& c : record->components) listed += (listed.empty() ? "" : ", ") + c;
  if (kinds.empty()) {
    std::cerr << "loom conformance: error: " << setup.subject.string() << " provides "
              << (listed.empty() ? "no component" : listed)
              << "; conformance suites exist for backends, attention kernels, optimizers and collectives\n";
    return 2;
  }
  std::cout << "loom conformance: " << setup.subject.string() << " (" << listed << ")\n"
            << "  oracles: " << loom::conformance::oracle_file("backend-reference").string() << ", "
            << loom::conformance::oracle_file("attention-naive").string() << ", "
            << (setup.torch_reference_dir / "index.json").string() << "\n";

  loom::test::use_plugins(loom::conformance::plugins());
  std::string filter_arg = "--gtest_filter=" + filter + "-" + own_build_checks;
  bool user_filter = false;
  for (const char* a : args) user_filter = user_filter || std::string(a).starts_with("--gtest_filter");
  if (!user_filter) args.insert(args.begin() + 1, filter_arg.data());
  int count = static_cast<int>(args.size());
  args.push_back(nullptr);
  ::testing::InitGoogleTest(&count, args.data());
  return RUN_ALL_TESTS() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "loom conformance: error: " << e.what() << "\n";
    return 2;
  }
}
