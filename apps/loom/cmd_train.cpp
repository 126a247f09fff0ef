// loom train CONFIG [a.b=c ...]
#include <unistd.h>

#include <iostream>

#include "command_line.hpp"
#include "loom/core/trainer.hpp"

namespace loom::app {

int run_train(const std::vector<std::string>& args) {
  CommonOptions common;
  std::vector<std::string> positional;
  po::options_description options("options");
  add_common_options(options, common);
  options.add_options()("args", po::value(&positional), "CONFIG and overrides");
  po::positional_options_description pos;
  pos.add("args", -1);
  po::variables_map vm;
  if (!parse(args, options, pos, vm,
             "usage: loom train CONFIG [a.b.c=value ...]\n\n"
             "Trains the model the config describes: every component is built from the config through the\n"
             "plugin registry, metrics go to the run directory (trainer.run_dir, default runs/<run_id>) and the\n"
             "terminal, and the final weights to <run_dir>/model.safetensors for `loom generate`.\n"
             "`loom config schema trainer` lists the trainer's options."))
    return 0;
  Runtime runtime(runtime_options(common, positional, true));
  TrainOptions train_options;
  train_options.out = &std::cout;
  train_options.interactive = ::isatty(STDOUT_FILENO) != 0;
  train(runtime, train_options);
  return 0;
}

}  // namespace loom::app
