#include "train/run_setup.hpp"

#include <string>

#include "loom/error.hpp"
#include "loom/run/generate.hpp"
#include "loom/run/run_config.hpp"
#include "loom/run/trainer.hpp"
#include "train/resume.hpp"

namespace loom::training {

namespace {

// trainer.microbatch_size, or Levanter's per_device_parallelism, or the whole batch.
std::int64_t micro_batch_size(const Options& trainer, std::int64_t batch_size) {
  std::int64_t micro_size = trainer.get<std::int64_t>("microbatch_size");
  const std::int64_t per_device = trainer.get<std::int64_t>("per_device_parallelism");
  if (per_device > 0 && micro_size > 0 && per_device != micro_size)
    throw UserError("trainer.microbatch_size (" + std::to_string(micro_size) +
                    ") and trainer.per_device_parallelism (" + std::to_string(per_device) +
                    ") disagree: set one of them");
  if (micro_size == 0) micro_size = per_device > 0 ? per_device : batch_size;
  if (batch_size % micro_size != 0)
    throw UserError("trainer.train_batch_size (" + std::to_string(batch_size) +
                    ") must be a multiple of the micro-batch size (" + std::to_string(micro_size) + ")");
  return micro_size;
}

// The state.json part of a resume: the step, the skip rule's window, the log interval.
void restore_state(Run& run, const checkpoint::TrainRecord& r) {
  TrainState& s = run.state;
  s.step = r.step;
  s.skipped_steps = r.skipped_steps;
  if (s.skip_rule && r.has_skip_window) s.skip_rule->restore(r.skip_losses, r.skip_grad_norms);
  s.interval.steps = r.interval_steps;
  s.interval.loss_sum = r.interval_loss;
  s.interval.seconds = r.interval_seconds;
  s.interval.train_seconds = r.train_seconds;
  s.interval.elapsed_before = r.elapsed_seconds;
}

}  // namespace

Run set_up_run(Runtime& runtime, ProgressPrinter& progress) {
  Run run;
  run.config = resolved_run_config(runtime);
  const Options trainer(*run.config.find("trainer"), "trainer");
  run.seed = static_cast<std::uint64_t>(trainer.get<std::int64_t>("seed"));
  run.num_steps = trainer.get<std::int64_t>("num_train_steps");
  run.batch_size = trainer.get<std::int64_t>("train_batch_size");
  run.micro_size = micro_batch_size(trainer, run.batch_size);

  RunComponents& c = run.components;
  c = create_components(runtime.registry(), run.config);

  // Where the run goes, and whether it continues one.
  std::optional<ResumePoint> resume;
  std::vector<std::string> resume_warnings;
  {
    run.directory = RunDirectory::open(trainer, run.config);
    run.checkpoint = checkpoint_settings(trainer, run.directory.path());
    checkpoint::CheckpointStore store(run.checkpoint.dir, run.checkpoint.retention);
    store.remove_leftovers();
    ResumeDecision decision = decide_resume(trainer, run.directory, store, run.num_steps);
    for (const auto& w : decision.warnings) progress.say("warning: " + w);
    resume = std::move(decision.point);
    if (resume && trainer.get<std::string>("run_id").empty() && !resume->record.run_id.empty())
      run.directory.adopt_run_id(resume->record.run_id);
    if (decision.finished) {
      run.trainer = trainer;
      run.finished = true;
      run.resumed_from = resume->record.step;
      progress.say("run " + run.directory.run_id() + " in " + run.directory.path().string() + " finished at step " +
                   std::to_string(resume->record.step) + " (checkpoint " + resume->dir.string() +
                   "): nothing to train; raise trainer.num_train_steps to train it further");
      return run;
    }
    // Printed once the checkpoint has loaded: a refusal comes without them.
    if (resume)
      resume_warnings =
          check_resume_config(*resume, config_file_text(run.directory.run_id(), run.config), run.num_steps);
    run.checkpoints = std::make_unique<checkpoint::CheckpointWriter>(std::move(store), run.checkpoint.async);
  }
  run.trainer = trainer;
  run.seq_len = c.model->max_seq_len();
  build_model_and_data(c, run.batch_size, run.seed);
  // A schedule whose options fit no run says so now; one it adapts to this run (a warmup clamped
  // to a shortened run) says what it changed.
  for (const auto& w : with_context("while checking the lr_schedule", [&] { return c.schedule->check(run.num_steps); }))
    progress.say("warning: " + w);
  if (resume && !trainer.get<std::string>("init_from").empty())
    progress.say("note: trainer.init_from is ignored: the run resumes from " + resume->dir.string());
  for (const auto& note : initialize_parameters(c, trainer, run.seed, /*init_from=*/!resume))
    progress.say("init_from: " + note);
  if (trainer.get<bool>("skip_bad_steps"))
    run.state.skip_rule.emplace(trainer.get<std::int64_t>("skip_step_window"), trainer.get<double>("skip_step_sigma"));
  if (resume) {
    load_checkpoint_tensors(*resume, c, config_file_text(run.directory.run_id(), run.config));
    with_context("while reading " + (resume->dir / "state.json").string(), [&] { restore_state(run, resume->record); });
    run.resumed_from = resume->record.step;
    for (const auto& w : resume_warnings) progress.say("warning: " + w);
  }

  // The run directory changes only now, once a checkpoint to resume from has loaded: a refused
  // resume leaves the run as it was.
  const std::int64_t from = resume ? resume->record.step : 0;
  if (const auto removed = run.checkpoints->store().discard_after(from); !removed.empty()) {
    std::string steps;
    for (auto s : removed) steps += " step-" + std::to_string(s);
    progress.say("note: removed the checkpoints past step " + std::to_string(from) + " in " +
                 run.checkpoints->store().dir().string() + ", which this run replaces:" + steps);
  }
  run.directory.write_config(run.config);
  run.directory.write_tokenizer_state(c.tokenizer->state());
  write_generation_info(run.directory.path(), c.dataset->separator_ends_documents());
  // Trackers keep what the run logged up to its checkpoint (records of steps <= the checkpoint's
  // step) and drop the rest: the resumed run logs those steps again.
  start_trackers(
      c, runtime.registry(), trainer,
      RunInfo{run.directory.path().string(), run.directory.run_id(), run.config, resume ? resume->record.step + 1 : 0});

  run.flops_per_token = c.model->flops_per_token(run.seq_len);
  run.peak_flops = trainer.get<double>("peak_flops");
  const bool probed = run.peak_flops <= 0;
  if (probed) run.peak_flops = probe_peak_flops(*c.backend);

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
  progress.header(header);
  if (resume)
    progress.say("resumed from checkpoint " + resume->dir.string() + " at step " + std::to_string(resume->record.step) +
                 " of " + std::to_string(run.num_steps));
  return run;
}

}  // namespace loom::training
