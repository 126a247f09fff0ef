#include "train/step_loop.hpp"

#include <sys/resource.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "loom/error.hpp"
#include "train/hooks/run_hooks.hpp"
#include "train/micro_batches.hpp"
#include "train/prefetcher.hpp"
#include "train/run_directory.hpp"
#include "train/stop_signals.hpp"
#include "train/train_step.hpp"

namespace loom::training {

namespace {

// This process's peak resident memory so far, in MiB (getrusage's ru_maxrss is in KiB on Linux).
int peak_resident_mib() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int>((usage.ru_maxrss + 1023) / 1024);
}

// One step on `batch`, timed, into the log interval. A step that diverged goes to `end`.
class StepRunner {
 public:
  explicit StepRunner(Run& run)
      : run_(run),
        step_(run.components, *run.world,
              StepSettings{run.seed, run.num_steps, run.micro_size, run.trainer.get<bool>("overlap_grad_reduce"),
                           run.trainer.get<bool>("crash_on_nan"), run.trainer.get<bool>("crash_on_inf"),
                           run.trainer.get<float>("z_loss_weight")}) {}

  StepOutcome run(const Batch& batch, LoopState& s, RunEnd& end) {
    TrainState& state = run_.state;
    const std::int64_t step = state.step;
    if (batch.batch_size != run_.batch_size || batch.seq_len != run_.seq_len)
      throw InternalError("the dataset returned a " + std::to_string(batch.batch_size) + " x " +
                          std::to_string(batch.seq_len) + " batch for a " + std::to_string(run_.batch_size) + " x " +
                          std::to_string(run_.seq_len) + " run");
    const auto t0 = Clock::now();
    // The host<->device copies of the step alone (batch in, scalars out, staged collectives), not
    // those of logging, evaluation, samples or checkpoints around it.
    reset_host_device_copies();
    try {
      result_ = step_.run(batch, state);
    } catch (...) {
      // A NaN or infinite loss or norm: the step that diverged goes to the metrics (JSON's null, a
      // gap in `loom report`'s charts) and to end.json.
      if (const auto& d = step_.divergence()) {
        s.log(d->step, {{"train/loss", d->loss}, {"train/grad_norm", d->grad_norm}});
        s.flush_trackers();
        end = RunEnd{"diverged", d->step, run_.num_steps, d->what, d->message};
      }
      throw;
    }
    if (state.ema) state.ema->update();
    const HostDeviceCopies copies = reset_host_device_copies();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    LogInterval& interval = state.interval;
    interval.train_seconds += dt;
    interval.seconds += dt;
    interval.loss_sum += result_.loss;
    interval.trained_tokens += count_targets(batch.targets);
    ++interval.steps;
    return StepOutcome{step + 1, step + 1 == run_.num_steps, &result_, copies};
  }

 private:
  Run& run_;
  TrainStep step_;
  StepResult result_;
};

// The end of a run that trained its last step, in this order: the final evaluation, weights,
// sample, checkpoint and (with everything saved: its failure costs no weights, and a rerun of the
// same command finds the run finished) task evaluation.
void finish_run(LoopState& s, ValidationHook& validation, SampleHook& samples, Checkpoints& checkpoints,
                TaskEvaluationHook& tasks) {
  const Run& run = s.run;
  const LogInterval& interval = run.state.interval;
  const double tokens_per_step = static_cast<double>(run.batch_size * run.seq_len);
  s.summary.steps = run.num_steps;
  s.summary.skipped_steps = run.state.skipped_steps;
  s.summary.tokens_per_second =
      interval.train_seconds > 0 ? tokens_per_step * static_cast<double>(run.num_steps) / interval.train_seconds : 0;
  s.summary.mfu = run.flops_per_token * s.summary.tokens_per_second / run.peak_flops;
  validation.final();
  save_final_weights(s);
  samples.final();
  s.flush_trackers();
  checkpoints.final();
  tasks.final();
  s.flush_trackers();
}

// The closing figures of a finished run, and its closing line.
void finish_summary(LoopState& s) {
  TrainSummary& summary = s.summary;
  summary.wall_seconds = s.elapsed();
  summary.peak_resident_bytes = std::int64_t{s.run.world->max_over_ranks(peak_resident_mib())} << 20;
  s.progress.done(s.run.num_steps, summary.wall_seconds, summary.tokens_per_second, summary.mfu,
                  summary.peak_resident_bytes, s.run.world->size(), summary.run_dir);
}

// The steps and the end of the run; `end` gets a divergence (execute() below records the end).
TrainSummary run_steps(Run& run, ProgressPrinter& progress, RunEnd& end, const AddedHooks& added) {
  TrainSummary summary;
  summary.run_dir = run.directory.path().string();
  summary.peak_flops = run.peak_flops;
  summary.resumed_from_step = run.resumed_from;
  if (run.finished) {
    summary.steps = run.num_steps;
    summary.already_finished = true;
    return summary;
  }
  StepRunner step(run);
  LoopState s(run, progress, summary);
  LoggingHook logging(s);
  ValidationHook validation(s);
  TaskEvaluationHook tasks(s);
  SampleHook samples(s);
  s.start = Clock::now();
  Checkpoints checkpoints(s);
  CheckpointCommitHook commit(checkpoints);
  CheckpointPolicyHook policy(s, checkpoints);
  StopSignalHook stop(s, checkpoints);
  std::vector<std::unique_ptr<AddedHook>> theirs;
  for (const auto& [hook, every] : added) theirs.push_back(std::make_unique<AddedHook>(s, checkpoints, hook, every));
  std::vector<Hook*> hooks{&logging, &validation, &tasks, &samples, &commit};
  for (const auto& h : theirs) hooks.push_back(h.get());
  hooks.insert(hooks.end(), {&stop, &policy});
  {
    Prefetcher prefetch(*run.components.dataset, run.state.step, run.num_steps,
                        static_cast<std::size_t>(run.trainer.get<std::int64_t>("prefetch")));
    Batch batch;
    while (run.state.step < run.num_steps) {
      prefetch.take(run.state.step, batch);
      const StepOutcome outcome = step.run(batch, s, end);
      for (Hook* h : hooks)
        if (h->due(outcome)) h->after_step(outcome);
      if (outcome.last || s.stopped_by != 0) break;
    }
  }
  progress.end_steps();
  if (s.stopped_by != 0)
    stop.final();
  else
    finish_run(s, validation, samples, checkpoints, tasks);
  if (s.task_failure) std::rethrow_exception(s.task_failure);
  if (s.stopped_by == 0) finish_summary(s);
  return summary;
}

// The current exception's text, for end.json. A data-parallel run's ReportedError names only the
// rank that printed the error.
std::string current_error_text() {
  try {
    throw;
  } catch (const ReportedError& e) {
    return std::string(e.what()) + " (`loom train` printed it)";
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return describe_current_exception();
  }
}

}  // namespace

TrainSummary execute(Run& run, ProgressPrinter& progress, const AddedHooks& hooks) {
  // Rank 0 records how the run ended in end.json. A resumed run removes the record of its earlier
  // end first: while it trains, the directory records no end.
  const bool records = run.world->is_primary() && !run.finished;
  if (records) run.directory.clear_end();
  RunEnd end;
  TrainSummary summary;
  try {
    summary = run_steps(run, progress, end, hooks);
  } catch (...) {
    if (records) {
      if (end.status.empty()) {
        const std::string text = current_error_text();
        end = RunEnd{"error", run.state.step, run.num_steps, text, text};
      }
      try {
        run.directory.write_end(end);
      } catch (const std::exception& e) {
        progress.say(std::string("warning: ") + e.what());
      }
    }
    throw;
  }
  if (records)
    run.directory.write_end(
        summary.stopped_by_signal != 0
            ? RunEnd{"stopped", summary.steps, run.num_steps, signal_name(summary.stopped_by_signal),
                     std::string("stopped by ") + signal_name(summary.stopped_by_signal) + " after step " +
                         std::to_string(summary.steps) + ", saving a checkpoint of it"}
            : RunEnd{"finished", summary.steps, run.num_steps, "", ""});
  return summary;
}

}  // namespace loom::training
