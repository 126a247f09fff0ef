// loom plugins [--json] [--strict] [--plugin-path DIR]...
#include <iostream>

#include "command_line.hpp"
#include "loom/run/describe.hpp"

namespace loom::app {

int run_plugins(const std::vector<std::string>& args) {
  CommonOptions common;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("json", "print JSON instead of a table")(
      "strict", "exit with status 1 when a plugin failed to load (for scripts and CI)");
  po::variables_map vm;
  if (!parse(args, options, {}, vm,
             "usage: loom plugins [--json] [--strict] [--plugin-path DIR]...\n\n"
             "Lists every component by kind (name, version, description, plugin file), then the plugins that\n"
             "failed to load with the reason, and the plugin path that was searched. Exit status 0, also when\n"
             "plugins failed (a run fails only when it needs one of them); with --strict, 1 when any failed."))
    return 0;
  const Runtime runtime(runtime_options(common, {}, false));
  std::cout << (vm.count("json") ? describe_plugins_json(runtime) : describe_plugins(runtime));
  if (!vm.count("strict")) return 0;
  std::size_t failed = 0;
  for (const auto& p : runtime.plugin_host().plugins())
    if (p.status == PluginRecord::Status::failed) ++failed;
  if (failed == 0) return 0;
  std::cout.flush();
  std::cerr << "loom: " << failed << (failed == 1 ? " plugin" : " plugins") << " failed to load (--strict)\n";
  return 1;
}

}  // namespace loom::app
