#include "train/run_setup.hpp"

#include <algorithm>
#include <string>

#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/run_config.hpp"
#include "loom/run/trainer.hpp"

namespace loom::training {

namespace {

// trainer.microbatch_size, or Levanter's per_device_parallelism, or the whole batch: a rank's
// whole slice of it when `ranks` share each batch.
std::int64_t micro_batch_size(const Options& trainer, std::int64_t batch_size, int ranks) {
  std::int64_t micro_size = trainer.get<std::int64_t>("microbatch_size");
  const std::int64_t per_device = trainer.get<std::int64_t>("per_device_parallelism");
  if (per_device > 0 && micro_size > 0 && per_device != micro_size)
    throw UserError("trainer.microbatch_size (" + std::to_string(micro_size) +
                    ") and trainer.per_device_parallelism (" + std::to_string(per_device) +
                    ") disagree: set one of them");
  if (micro_size == 0) micro_size = per_device > 0 ? per_device : std::max<std::int64_t>(1, batch_size / ranks);
  if (batch_size % micro_size != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size) +
                    ") must be a multiple of the micro-batch size (" + std::to_string(micro_size) + ")");
  return micro_size;
}

}  // namespace

Run set_up_run(Runtime& runtime, ProgressPrinter& progress) {
  Run run;
  run.config = resolved_run_config(runtime);
  run.trainer = Options(*run.config.find("trainer"), "trainer");
  const Options& trainer = run.trainer;
  run.seed = static_cast<std::uint64_t>(trainer.get<std::int64_t>("seed"));
  run.num_steps = trainer.get<std::int64_t>("num_train_steps");
  run.batch_size = trainer.get<std::int64_t>("train_batch_size");

  // The ranks first: only rank 0 prints and writes files, and all must agree on the config.
  run.parallel =
      std::make_unique<DataParallel>(create_collective(runtime.registry(), run.config),
                                     static_cast<std::int64_t>(trainer.get<double>("grad_bucket_mb") * 1024 * 1024));
  DataParallel& parallel = *run.parallel;
  if (!parallel.is_primary()) progress.silence();
  parallel.check_same_config(run.config);
  run.micro_size = micro_batch_size(trainer, run.batch_size, parallel.size());
  parallel.check_batch(run.batch_size, run.micro_size);

  RunComponents& c = run.components;
  c = create_components(runtime.registry(), run.config);
  if (parallel.is_primary()) run.directory = RunDirectory::create(trainer, run.config);
  run.seq_len = c.model->max_seq_len();
  build_model_and_data(c, run.batch_size, run.seed);
  if (parallel.is_primary()) {
    run.directory.write_tokenizer_state(c.tokenizer->state());
    write_generation_info(run.directory.path(), c.dataset->separator_ends_documents());
  }
  // A schedule whose options fit no run says so now; one it adapts to this run (a warmup clamped
  // to a shortened run) says what it changed.
  for (const auto& w : with_context("while checking the lr_schedule", [&] { return c.schedule->check(run.num_steps); }))
    progress.say("warning: " + w);
  // Gradient storage first: flat buckets, or this rank's shard of a ZeRO-1 run.
  if (trainer.get<bool>("shard_optimizer_state"))
    parallel.shard(c.model->parameters());
  else
    parallel.attach(c.model->parameters());
  for (const auto& note :
       initialize_parameters(c, trainer, run.seed, [&](const Parameter* p) { return parallel.owns(p); }))
    progress.say("init_from: " + note);
  parallel.check_same_parameters(c.parameters);
  if (parallel.is_primary())
    start_trackers(c, runtime.registry(), trainer,
                   RunInfo{run.directory.path().string(), run.directory.run_id(), run.config, 0});

  run.flops_per_token = c.model->flops_per_token(run.seq_len);
  run.peak_flops = trainer.get<double>("peak_flops");
  const bool probed = run.peak_flops <= 0;
  if (probed) run.peak_flops = probe_peak_flops(*c.backend);
  // MFU of a data-parallel run is against every rank's roof together.
  run.peak_flops = parallel.sum(run.peak_flops);
  if (trainer.get<bool>("skip_bad_steps"))
    run.state.skip_rule.emplace(trainer.get<std::int64_t>("skip_step_window"), trainer.get<double>("skip_step_sigma"));

  RunHeader header;
  header.run_id = run.directory.run_id();
  header.run_dir = run.directory.path().string();
  header.model_type = run.config.at_path("model.type")->as_string();
  header.num_parameters = c.model->num_parameters();
  header.vocab_size = c.model->vocab_size();
  header.seq_len = run.seq_len;
  header.flops_per_token = run.flops_per_token;
  header.train_tokens = c.dataset->num_tokens(Split::train);
  header.validation_tokens = c.dataset->num_tokens(Split::validation);
  header.batch_size = run.batch_size;
  header.micro_size = run.micro_size;
  header.num_steps = run.num_steps;
  header.peak_flops = run.peak_flops;
  header.peak_flops_probed = probed;
  header.ranks = parallel.size();
  header.sharded = parallel.sharded();
  for (const auto& [name, tensor] : c.optimizer->state())
    header.optimizer_state_bytes += tensor.numel() * static_cast<std::int64_t>(sizeof(float));
  header.collective = parallel.collective().describe();
  progress.header(header);
  return run;
}

}  // namespace loom::training
