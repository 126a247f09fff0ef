// loom plugins [--json] [--plugin-path DIR]...
#include <iostream>

#include "command_line.hpp"
#include "loom/run/describe.hpp"

namespace loom::app {

int run_plugins(const std::vector<std::string>& args) {
  CommonOptions common;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("json", "print JSON instead of a table");
  po::variables_map vm;
  if (!parse(args, options, {}, vm,
             "usage: loom plugins [--json] [--plugin-path DIR]...\n\n"
             "Lists every component by kind (name, version, description, plugin file), then the plugins that\n"
             "failed to load with the reason, and the plugin path that was searched."))
    return 0;
  const Runtime runtime(runtime_options(common, {}, false));
  std::cout << (vm.count("json") ? describe_plugins_json(runtime) : describe_plugins(runtime));
  return 0;
}

}  // namespace loom::app
