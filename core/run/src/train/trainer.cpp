// The trainer: `loom train`. The run is set up (run_setup), then stepped (step_loop, with the
// hooks of hooks/ between the steps); each step (train_step) runs the batch's micro-batches
// (micro_batches) and updates the weights. See core/run/include/loom/run/trainer.hpp for the shape
// of a step.
#include "loom/run/trainer.hpp"

#include <iostream>
#include <string>
#include <utility>

#include "train/progress.hpp"
#include "train/run_setup.hpp"
#include "train/step_loop.hpp"
#include "train/world.hpp"

namespace loom {

namespace {
// The largest size of a mesh axis: far beyond any run, and small enough that the axes' product
// (and every rank number) fits the ints that MPI counts ranks in.
constexpr double kMaxMeshAxis = 1 << 20;
}  // namespace

OptionSchema trainer_schema() {
  OptionSchema s;
  s.integer("seed", 0, "Seed of every random stream: initialisation, data order, dropout, sampling.").min(0);
  s.integer("num_train_steps", 1000, "Optimizer steps to run.").min(1);
  s.integer("train_batch_size", 8, "Sequences per optimizer step (Levanter's default is 512; loom's suits one CPU).")
      .min(1);
  s.integer("microbatch_size", 0,
            "Sequences per forward/backward pass; gradients accumulate over train_batch_size / microbatch_size "
            "passes. 0: the whole batch at once.")
      .min(0);
  s.integer("per_device_parallelism", -1, "Levanter's name for microbatch_size on one device; -1: the whole batch.")
      .min(-1);
  s.integer("log_every", 10, "Steps between log lines, metrics records and progress updates.").min(1);
  s.integer("steps_per_eval", 1000, "Steps between evaluations on the validation split; 0: only at the end.").min(0);
  s.integer("max_eval_batches", 10, "Validation batches per evaluation (the same ones every time); 0: none.").min(0);
  s.list("eval_tasks", OptionType::string, Value::List{},
         "Benchmark tasks scored during training as `loom eval --tasks` scores them (docs/evaluation.md): a family's "
         "name (reads eval_data/NAME.jsonl), FAMILY:FILE or a task file, relative to the current directory; logged "
         "as eval/<task>/<metric> (acc, acc_norm, perplexity...). Empty: none.");
  s.integer("steps_per_task_eval", 0, "Steps between scorings of eval_tasks; 0: only at the end.").min(0);
  s.integer("eval_task_limit", 0, "Documents of each of eval_tasks scored (the first ones); 0: all.").min(0);
  s.integer("eval_task_batch_size", 8, "Sequences per forward pass when scoring eval_tasks.").min(1);
  s.integer("sample_every", 0, "Steps between text samples printed during training; 0: only at the end.").min(0);
  s.integer("sample_length", 200, "Tokens per sample; 0: no samples.").min(0);
  s.string("sample_prompt", "",
           "Text the samples continue (empty: a new document, started as the training data starts one).");
  s.number("sample_temperature", 0.8, "Sampling temperature of the samples; 0: greedy.").min(0.0);
  s.integer("sample_top_k", 0, "Keep only the k most likely tokens when sampling; 0: all.").min(0);
  s.number("sample_top_p", 1.0,
           "Keep only the most likely tokens whose probabilities add up to p when sampling; 1: all.")
      .min(0.0, false)
      .max(1.0);
  s.number("peak_flops", 0.0,
           "FLOP/s that MFU is measured against; 0: measure with a short GEMM probe at start-up (in the precision of "
           "the backend's matrix products as it reports them: the bf16 roof when they are bf16, as by default on a CPU "
           "with AVX512-BF16).")
      .min(0.0);
  s.string("run_dir", "", "Directory of this run's files; empty: runs/<run_id>.");
  s.string("run_id", "", "Name of the run; empty: the config file's name and the start time.");
  s.boolean("crash_on_nan", true, "Stop with an error when the loss or a gradient is NaN.");
  s.boolean("crash_on_inf", true, "Stop with an error when the loss or a gradient is infinite.");
  s.boolean("skip_bad_steps", false,
            "Skip the update of a step whose loss or gradient norm exceeds the rolling mean by skip_step_sigma "
            "standard deviations (Levanter's SkipStepConfig).");
  s.integer("skip_step_window", 128, "Steps in the rolling window of skip_bad_steps.").min(2);
  s.number("skip_step_sigma", 6.0, "Standard deviations above the rolling mean that count as a bad step.")
      .min(0.0, false);
  s.boolean("decay_embeddings", false, "Apply weight decay to embedding tables.");
  s.boolean("decay_norms", false, "Apply weight decay to normalisation weights.");
  s.boolean("decay_biases", false, "Apply weight decay to biases.");
  s.list("trackers", OptionType::string, {"jsonl", "tensorboard"}, "Trackers that record the run's metrics.");
  s.string("init_from", "",
           "Start from these weights instead of the initialisation: a Hugging Face model directory (config.json "
           "and safetensors), a loom run or checkpoint directory, or a model.safetensors; empty: none. Relative "
           "to the current directory. Ignored when the run resumes from a checkpoint, except by the reference model of "
           "an objective that has one (dpo: the starting weights, always) and under LoRA (its checkpoints hold the "
           "adapters alone: the base weights come from here again).");
  s.string("init_from_weights", "ema",
           "Of a loom run or checkpoint in init_from trained with ema_decay: ema (its weight average, what its "
           "evaluations measured and its final model.safetensors holds) or live (the weights the optimizer "
           "updated). A run without an average has only its live weights, which either takes.")
      .one_of({"ema", "live"});
  s.list(
      "trainable", OptionType::string, Value::List{},
      "Parameter-name patterns of the parameters to train (\"h.*.attn.*\", \"*.bias\", \"ln_f\"); the others are "
      "frozen: no gradient, no optimizer state. Empty: every parameter. A pattern that matches nothing is an error.");
  s.list("frozen", OptionType::string, Value::List{},
         "Parameter-name patterns of parameters to freeze (after trainable): constants to the backward pass, with no "
         "gradient buffer and no optimizer state. A pattern that matches nothing is an error.");
  s.number("z_loss_weight", 0.0,
           "z-loss (PaLM, MaxText): adds z_loss_weight * log(Z)^2 per target to the training loss, Z being the "
           "softmax normaliser of the output logits; 0: none (1e-4 is PaLM's).")
      .min(0.0);
  s.number("ema_decay", 0.0,
           "Keep an exponential moving average of the weights, ema = ema_decay * ema + (1 - ema_decay) * w after every "
           "step, and evaluate and save it instead of the weights; 0: none (0.999 is usual).")
      .min(0.0)
      .max(1.0, false);
  s.boolean("save_final", true, "Write the final weights (model.safetensors) into the run directory.");
  s.number("grad_bucket_mb", 25.0,
           "Data parallel: gradients are summed across ranks in buckets of about this many megabytes (PyTorch DDP's "
           "bucket_cap_mb).")
      .min(0.0, false);
  s.boolean("overlap_grad_reduce", true,
            "Data parallel: start reducing a bucket of gradients as soon as the backward pass has finished it, "
            "while it computes the rest; false: reduce after the backward pass (for measuring the overlap).");
  s.boolean("shard_optimizer_state", false,
            "Data parallel: each rank keeps the optimizer state of only its 1/N of the parameters (ZeRO stage 1); "
            "gradients are reduce-scattered and the updated parameters all-gathered.");
  s.string("memory_check", "refuse",
           "The start-up memory estimate of each rank (docs/training.md, \"Memory estimate\"): refuse: a run whose "
           "estimate exceeds the memory available (the cgroup limit, else MemAvailable, shared by the ranks of one "
           "host) stops before allocating, exit 2; warn: say so and train; off: no check (the estimate is still "
           "printed).")
      .one_of({"refuse", "warn", "off"});
  OptionSchema mesh;
  mesh.integer("data", -1,
               "Data-parallel replicas: ranks that each hold the whole model and train on different rows of every "
               "batch, their gradients summed; -1: the ranks the other axes leave.")
      .range(-1, kMaxMeshAxis);
  mesh.integer("fsdp", 1,
               "Fully sharded data parallelism (ZeRO-3): ranks that each hold 1/fsdp of every parameter, gradient and "
               "optimizer state, gathering a sharding unit (a transformer block) just before it runs and freeing it "
               "after (docs/distributed.md, \"Fully sharded data parallelism\").")
      .range(-1, kMaxMeshAxis);
  mesh.integer("tensor", 1,
               "Tensor parallelism (Megatron-LM): ranks that split each layer's matrices between them (attention by "
               "heads, the MLP by its width, embeddings and output by vocabulary, a mixture's experts) and run the "
               "same rows, exchanging activations in every layer; the model must declare a parallel plan "
               "(docs/distributed.md, \"Tensor parallelism\").")
      .range(-1, kMaxMeshAxis);
  s.object("mesh", std::move(mesh),
           "How the ranks of `mpirun -np N` are laid out: data x fsdp x tensor = N, data-major (ranks of one tensor "
           "group are neighbours, then those of one fsdp group); one axis may be -1, the ranks the others leave "
           "(docs/distributed.md, \"The mesh\").");
  OptionSchema fsdp;
  fsdp.boolean("reshard_after_forward", true,
               "Free each unit's gathered weights after its forward pass and gather them again for its backward "
               "pass (PyTorch FSDP2's default); false keeps them from the forward to the backward pass (more "
               "memory, one gather a step less: ZeRO-2-like).");
  fsdp.boolean("prefetch", true,
               "Start gathering the next unit's weights while the current one computes, in the order the first "
               "micro-batch took them; false: gather each when it is needed (for measuring the overlap).");
  s.object("fsdp", std::move(fsdp), "Fully sharded data parallelism (trainer.mesh's fsdp axis > 1).");
  OptionSchema checkpoint;
  checkpoint
      .integer("save_every_steps", 0,
               "Save a checkpoint every this many steps; 0: no step policy (the time policy may still save).")
      .min(0);
  checkpoint
      .number("save_every_minutes", 15.0,
              "Save a checkpoint whenever this many minutes have passed since the last one; 0: no time policy.")
      .min(0.0);
  checkpoint
      .integer("keep_last", 2,
               "Rolling checkpoints kept, counting only those that verify: older ones are deleted once a new one is "
               "committed (one that fails verification is moved aside, never deleted).")
      .min(1);
  checkpoint
      .integer("keep_every_steps", 0,
               "Save a checkpoint at every multiple of this step and keep it for good (keep_last never deletes "
               "it); 0: none.")
      .min(0);
  checkpoint.string("dir", "", "Directory of the checkpoints; empty: <run_dir>/checkpoints.");
  checkpoint.boolean("async", true,
                     "Write checkpoints on a background thread from a snapshot taken between steps; false: the "
                     "step loop waits for each write.");
  s.object("checkpoint", std::move(checkpoint),
           "Checkpoints: when they are saved, which stay, where (docs/checkpoints.md). A run with any ends with "
           "one at its last step.");
  s.string("resume", "auto",
           "Continue from a checkpoint: auto (the run directory's latest valid one; none there: start afresh; "
           "checkpoints there and none valid: refused), never (start afresh, moving checkpoints that fail "
           "verification aside; a run directory with final weights or a valid checkpoint is refused), or the path "
           "of a checkpoint (step-N/, a checkpoints/ directory or a run directory).");
  s.integer("prefetch", 2, "Batches prepared ahead on a separate thread.").min(1).max(64);
  return s;
}

ReportedError::~ReportedError() = default;

void agree_on_start_up_error(const Error& error, const RuntimeOptions& runtime, const TrainOptions& options) {
  const training::Launcher launcher = training::launcher_from_environment();
  if (launcher.kind != training::Launcher::Kind::openmpi || launcher.size <= 1 || !options.report_error) throw error;
  std::unique_ptr<Runtime> plugins;
  std::unique_ptr<training::World> world;
  try {
    RuntimeOptions without_config = runtime;
    without_config.config.reset();
    without_config.overrides.clear();
    plugins = std::make_unique<Runtime>(without_config);
    // The same collectives as a rank that read its config makes first (set_up_run): connect,
    // then agree on how reading the config ended.
    world = std::make_unique<training::World>(training::create_collective(plugins->registry(), Value::map()));
  } catch (...) {
    throw error;
  }
  world->set_error_reporter(options.report_error);
  world->together([&] { throw error; });
  throw error;  // (together() threw ReportedError)
}

Trainer::Trainer(Runtime& runtime, TrainOptions options) : runtime_(runtime), options_(std::move(options)) {}

Trainer& Trainer::add_hook(TrainHook hook, std::int64_t every) {
  if (!hook) throw InternalError("Trainer::add_hook: the hook is empty");
  if (every < 1) throw InternalError("Trainer::add_hook: every must be at least 1, not " + std::to_string(every));
  hooks_.emplace_back(std::move(hook), every);
  return *this;
}

TrainSummary Trainer::train() {
  training::ProgressPrinter progress(options_.out ? *options_.out : std::cout, options_.interactive);
  training::Run run = training::set_up_run(runtime_, progress, options_.report_error);
  return training::execute(run, progress, hooks_);
}

TrainSummary train(Runtime& runtime, const TrainOptions& options) {
  return Trainer(runtime, options).train();
}

}  // namespace loom
