#include "loom/run/run_config.hpp"

#include "loom/run/trainer.hpp"

namespace loom {

const OptionSchema& run_config_schema() {
  static const OptionSchema schema = [] {
    OptionSchema s;
    s.object("plugins", plugins_section_schema(), "Where to find plugins.");
    s.component("backend", "backend", "cpu", "The backend that implements the tensor operations.");
    s.component("model", "model", "", "The model architecture (its `attention` option names the kernel).").nullable();
    s.component("optimizer", "optimizer", "adamw", "The optimizer (its learning_rate is the schedule's peak).");
    s.component("lr_schedule", "lr_schedule", "cosine", "The learning-rate schedule.");
    s.component("data", "dataset", "", "The training and validation data.").nullable();
    s.component("tokenizer", "tokenizer", "byte", "The tokenizer.");
    s.object("trainer", trainer_schema(), "The training loop: steps, batch, logging, evaluation, sampling.");
    s.component("collective", "collective", "",
                "Communication between the processes of a data-parallel run; null: `mpi` under mpirun, else `single`.")
        .nullable();

    return s;
  }();
  return schema;
}

Value resolved_run_config(const Runtime& runtime) {
  return runtime.resolved_config(run_config_schema());
}

}  // namespace loom
