// loom: train and inspect transformer language models built from plugins.
//
// Exit status: 0 on success, 2 for a user error (bad config, missing file, unknown name, bad
// command line), 1 for an internal error (a bug in loom or a plugin).
#include <boost/program_options/errors.hpp>
#include <iostream>

#include "command_line.hpp"
#include "loom/build_isa.hpp"
#include "loom/error.hpp"
#include "loom/run/trainer.hpp"
#include "loom/version.hpp"

// What the executable's code needs, checked by cpu_check.cpp before anything else runs.
extern "C" const char loom_executable_isa[] = LOOM_BUILD_ISA;

namespace {

void print_usage(std::ostream& out) {
  out << "usage: loom COMMAND [ARGS...]\n\ncommands:\n";
  for (const auto& c : loom::app::commands()) {
    std::string name = c.name;
    out << "  " << name << std::string(name.size() < 10 ? 10 - name.size() : 1, ' ') << c.summary << "\n";
  }
  out << "\n`loom COMMAND --help` describes a command. Version " << loom::sdk_version << ".\n";
}

int main_checked(int argc, char** argv) {
  if (argc < 2) {
    print_usage(std::cerr);
    return 2;
  }
  const std::string name = argv[1];
  if (name == "--help" || name == "-h" || name == "help") {
    print_usage(std::cout);
    return 0;
  }
  if (name == "--version") {
    std::cout << "loom " << loom::sdk_version << " (plugin ABI " << loom::abi_major << "." << loom::abi_minor << ")\n";
    return 0;
  }
  const std::vector<std::string> args(argv + 2, argv + argc);
  for (const auto& c : loom::app::commands())
    if (name == c.name) return c.run(args);
  std::vector<std::string> names;
  for (const auto& c : loom::app::commands()) names.emplace_back(c.name);
  const std::string guess = loom::closest_match(name, names);
  throw loom::UserError("unknown command '" + name + "'" + (guess.empty() ? "" : "; did you mean '" + guess + "'?") +
                        " (run `loom --help` for the list)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return main_checked(argc, argv);
  } catch (const loom::ReportedError& e) {
    // A data-parallel run's error, printed once already by the rank that had it.
    return e.kind() == loom::ErrorKind::user ? 2 : 1;
  } catch (const loom::Error& e) {
    loom::app::print_error(e);
    return e.kind() == loom::ErrorKind::user ? 2 : 1;
  } catch (const boost::program_options::error& e) {
    std::cerr << "loom: error: " << e.what() << " (see `loom " << (argc > 1 ? argv[1] : "") << " --help`)\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "loom: internal error: " << e.what() << "\n";
    return 1;
  } catch (...) {
    std::cerr << "loom: internal error: " << loom::describe_current_exception() << "\n";
    return 1;
  }
}
