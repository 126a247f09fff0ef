#include "loom/run/run_config.hpp"

#include "loom/run/lora.hpp"
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

const OptionSchema& run_config_schema() {
  static const OptionSchema schema = [] {
    OptionSchema s;
    s.object("plugins", plugins_section_schema(), "Where to find plugins.");
    s.component("backend", "backend", "cpu", "The backend that implements the tensor operations.");
    s.component("model", "model", std::nullopt, "The model architecture (its `attention` option names the kernel).");
    s.component("optimizer", "optimizer", "adamw",
                "The optimizer, with the peak learning_rate and the max_grad_norm clip that the trainer applies.")
        .section_options(optimizer_section_options());
    s.component("lr_schedule", "lr_schedule", "cosine", "The learning-rate schedule.");
    s.component("data", "dataset", std::nullopt,
                "The training and validation data: one dataset, or a `mixture` of several with `weights` "
                "(docs/datasets.md, \"Mixtures\").");
    s.component("tokenizer", "tokenizer", "byte", "The tokenizer.");
    s.component("objective", "objective", "causal_lm",
                "What training minimises: causal_lm (next-token cross-entropy), sft, dpo (preference pairs against "
                "a frozen reference model). See docs/fine-tuning.md.");
    s.object("trainer", trainer_schema(), "The training loop: steps, batch, logging, evaluation, sampling.");
    s.object(
        "lora", lora_schema(),
        "Low-rank adapters (LoRA) on the model's linear weights; the base weights are frozen (docs/fine-tuning.md).");
    s.component("collective", "collective", std::nullopt,
                "Communication between the processes of a data-parallel run; null: `mpi` under mpirun, else `single`.");

    return s;
  }();
  return schema;
}

Value resolved_run_config(const Runtime& runtime) {
  const Value* data = runtime.raw_config().find("data");
  if (!data || !training::is_mixture(*data)) return runtime.resolved_config(run_config_schema());
  // A mixture of datasets (train/mixture.hpp): the run layer validates `data` itself, the rest as usual.
  const Value& raw = runtime.raw_config();
  const std::string what =
      raw.location().known() ? "while validating " + raw.location().file : std::string("while validating the config");
  return with_context(what, [&] {
    Value others = raw;
    others.erase("data");
    Value resolved = config::validate(run_config_schema(), others, "", runtime.registry());
    resolved.set("data", training::validate_mixture(*data, runtime.registry()));
    return resolved;
  });
}

}  // namespace loom
