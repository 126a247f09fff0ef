// loom checkpoints RUN_DIR
#include <iostream>

#include "command_line.hpp"
#include "loom/error.hpp"
#include "loom/run/checkpoints.hpp"

namespace loom::app {

int run_checkpoints(const std::vector<std::string>& args) {
  std::string dir;
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("dir", po::value(&dir), "a run directory or checkpoint directory");
  po::positional_options_description pos;
  pos.add("dir", 1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom checkpoints RUN_DIR\n\n"
             "Lists a run's checkpoints with their step, time, size and whether each verifies (every file its\n"
             "manifest lists is there, with its size and CRC-32C); `latest` marks where a resumed run continues.\n"
             "RUN_DIR may also be the checkpoint directory itself."))
    return 0;
  if (dir.empty()) throw UserError("`loom checkpoints` needs a run directory: `loom checkpoints RUN_DIR`");
  print_checkpoints(std::cout, list_checkpoints(dir));
  return 0;
}

}  // namespace loom::app
