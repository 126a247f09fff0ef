#include "loom/run/run_config.hpp"

#include "loom/run/trainer.hpp"
#include "train/mixture.hpp"

namespace loom {

// The options of the optimizer section that the run layer reads, whichever optimizer the section
// names: the schedule shapes the peak rate, the trainer clips the gradients before the update.
// Levanter's layout: they sit under `optimizer`, but no optimizer plugin declares or reads them.
OptionSchema optimizer_section_options() {
  OptionSchema s;
  s.number("learning_rate", 6e-4, "Peak learning rate; the lr_schedule shapes it (read by the trainer).").min(0.0);
  s.number("max_grad_norm", 1.0, "Global gradient-norm clip applied by the trainer before the update; 0 or null: none.")
      .min(0.0)
      .nullable();
  return s;
}

namespace {

// `mixture_data`: the `data` section is a mixture of datasets (train/mixture.hpp), which the run
// layer validates itself.
OptionSchema make_run_config_schema(bool mixture_data) {
  OptionSchema s;
  s.object("plugins", plugins_section_schema(), "Where to find plugins.");
  s.component("backend", "backend", "cpu", "The backend that implements the tensor operations.");
  s.component("model", "model", std::nullopt, "The model architecture (its `attention` option names the kernel).");
  s.component("optimizer", "optimizer", "adamw",
              "The optimizer, with the peak learning_rate and the max_grad_norm clip that the trainer applies.")
      .section_options(optimizer_section_options());
  s.component("lr_schedule", "lr_schedule", "cosine", "The learning-rate schedule.");
  if (mixture_data)
    s.any("data", Value(), "A mixture of datasets (docs/datasets.md, \"Mixtures\").");
  else
    s.component("data", "dataset", std::nullopt,
                "The training and validation data: one dataset, or a `mixture` of several with `weights` "
                "(docs/datasets.md, \"Mixtures\").");
  s.component("tokenizer", "tokenizer", "byte", "The tokenizer.");
  s.object("trainer", trainer_schema(), "The training loop: steps, batch, logging, evaluation, sampling.");
  s.component("collective", "collective", std::nullopt,
              "Communication between the processes of a data-parallel run; null: `mpi` under mpirun, else `single`.");

  return s;
}

}  // namespace

const OptionSchema& run_config_schema() {
  static const OptionSchema schema = make_run_config_schema(false);
  return schema;
}

Value resolved_run_config(const Runtime& runtime) {
  const Value* data = runtime.raw_config().find("data");
  if (!data || !training::is_mixture(*data)) return runtime.resolved_config(run_config_schema());
  static const OptionSchema mixture_schema = make_run_config_schema(true);
  Value resolved = runtime.resolved_config(mixture_schema);
  const Value& raw = runtime.raw_config();
  const std::string what =
      raw.location().known() ? "while validating " + raw.location().file : std::string("while validating the config");
  resolved.set("data", with_context(what, [&] { return training::validate_mixture(*data, runtime.registry()); }));
  return resolved;
}

}  // namespace loom
