// loom train CONFIG [a.b=c ...]
#include <unistd.h>

#include <iostream>

#include "command_line.hpp"
#include "loom/run/trainer.hpp"

namespace loom::app {

int run_train(const std::vector<std::string>& args) {
  const auto options = parse_config_command(
      args,
      "usage: loom train CONFIG [a.b.c=value ...]\n\n"
      "Trains the model the config describes: every component is built from the config through the\n"
      "plugin registry, metrics go to the run directory (trainer.run_dir, default runs/<run_id>) and the\n"
      "terminal, and the final weights to <run_dir>/model.safetensors for `loom generate`.\n"
      "A run directory with a checkpoint continues from it (trainer.resume: auto). SIGTERM or SIGINT saves a\n"
      "checkpoint at the next step boundary and exits with status 128 + the signal (143, 130); a second\n"
      "SIGINT stops at once (docs/checkpoints.md).\n"
      "`loom config schema config` lists the trainer's options (docs/training.md explains them).");
  if (!options) return 0;
  Runtime runtime(*options);
  for (const auto& d : runtime.dropped_options()) std::cout << "note: " << d.str() << "\n";
  TrainOptions train_options;
  train_options.out = &std::cout;
  train_options.interactive = ::isatty(STDOUT_FILENO) != 0;
  train_options.report_error = print_error;
  const TrainSummary summary = train(runtime, train_options);
  return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
}

}  // namespace loom::app
