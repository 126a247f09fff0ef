// loom conformance PLUGIN.so [GoogleTest options]: loom's conformance suites on a plugin's
// backends, attention kernels and optimizers, against the installed oracles. The suites are a
// GoogleTest program of their own, installed next to the plugin directory
// (<prefix>/lib/loom/loom-conformance); this command runs it in place of itself.
#include <unistd.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"

namespace loom::app {

int run_conformance(const std::vector<std::string>& args) {
  const std::filesystem::path runner = std::filesystem::path(boost::dll::program_location().parent_path().string()) /
                                       ".." / "lib" / "loom" / "loom-conformance";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::cout << "usage: loom conformance PLUGIN.so [GoogleTest options, e.g. --gtest_filter=...]\n\n"
                 "Runs loom's conformance suites on the components PLUGIN.so registers, against the oracles\n"
                 "installed with loom: a backend, operation by operation (values and gradients) against the\n"
                 "`reference` backend, plus the kernel contract and determinism; an attention kernel against\n"
                 "`naive` over masks, windows, soft-caps, head groupings and strided operands; an optimizer\n"
                 "against the optimizer contract and, for the algorithms PyTorch's trajectories were recorded\n"
                 "for, step by step against PyTorch; a collective, on the world and on the groups along each\n"
                 "axis of every mesh of its ranks, for results and bit-for-bit determinism (run it under\n"
                 "`mpirun -np 4`). Exit status 0: every test passed; 1: a test failed; 2: the plugin could\n"
                 "not be checked. CMake: loom_add_conformance_test(TARGET) after\n"
                 "find_package(Loom) registers this command as a test of a plugin target.\n";
    return args.empty() ? 2 : 0;
  }
  if (!std::filesystem::exists(runner))
    throw UserError("the conformance suites are not installed with this loom (" + runner.lexically_normal().string() +
                    " is missing; loom was built with LOOM_BUILD_TESTS=OFF?)");
  std::vector<std::string> argv = {runner.lexically_normal().string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> c_argv;
  for (std::string& a : argv) c_argv.push_back(a.data());
  c_argv.push_back(nullptr);
  std::cout.flush();
  ::execv(c_argv[0], c_argv.data());
  throw InternalError("could not run " + argv[0] + ": " + std::strerror(errno));
}

}  // namespace loom::app
