// loom train CONFIG [a.b=c ...]
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <optional>

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
  TrainOptions train_options;
  train_options.out = &std::cout;
  train_options.interactive = ::isatty(STDOUT_FILENO) != 0;
  train_options.report_error = print_error;
  std::optional<Runtime> runtime;
  try {
    runtime.emplace(*options);
  } catch (const Error& e) {
    // Under mpirun, printed once by rank 0 when every rank met it.
    agree_on_start_up_error(e, *options, train_options);
  }
  // Under mpirun every rank read the same config (the ranks check it): rank 0 says the notes.
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (!rank || std::string(rank) == "0")
    for (const auto& d : runtime->dropped_options()) std::cout << "note: " << d.str() << "\n";
  const TrainSummary summary = train(*runtime, train_options);
  return summary.stopped_by_signal != 0 ? 128 + summary.stopped_by_signal : 0;
}

}  // namespace loom::app
