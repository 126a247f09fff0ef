#include "train/step_loop.hpp"

#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <deque>
#include <exception>
#include <iomanip>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "train/checkpointing.hpp"
#include "train/evaluation.hpp"
#include "train/micro_batches.hpp"
#include "train/prefetcher.hpp"
#include "train/run_directory.hpp"
#include "train/sampling.hpp"
#include "train/stop_signals.hpp"
#include "train/task_evaluation.hpp"
#include "train/train_step.hpp"

namespace loom::training {

using Clock = std::chrono::steady_clock;

namespace {

std::string describe_write(const checkpoint::WriteReport& r) {
  std::ostringstream line;
  line << "checkpoint " << r.path.string() << ": " << format_bytes(r.bytes) << " written in " << std::fixed
       << std::setprecision(2) << r.write_seconds << " s";
  if (r.snapshot_seconds > 0) line << " (snapshot " << r.snapshot_seconds << " s)";
  if (!r.removed.empty()) {
    line << "; removed";
    for (auto s : r.removed) line << " step-" << s;
  }
  for (const auto& a : r.set_aside) line << "\nwarning: " << describe_set_aside(a);
  return line.str();
}

// This process's peak resident memory so far, in MiB (getrusage's ru_maxrss is in KiB on Linux).
int peak_resident_mib() {
  struct rusage usage {};
  if (::getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<int>((usage.ru_maxrss + 1023) / 1024);
}

// The steps and the end of the run; `end` gets a divergence (execute() below records the end).
TrainSummary run_steps(Run& run, ProgressPrinter& progress, RunEnd& end) {
  TrainSummary summary;
  summary.run_dir = run.directory.path().string();
  summary.peak_flops = run.peak_flops;
  summary.resumed_from_step = run.resumed_from;
  if (run.finished) {
    summary.steps = run.num_steps;
    summary.already_finished = true;
    return summary;
  }

  const Options& trainer = run.trainer;
  RunComponents& c = run.components;
  TrainState& state = run.state;
  LogInterval& interval = state.interval;
  const std::int64_t num_steps = run.num_steps;
  const std::int64_t log_every = trainer.get<std::int64_t>("log_every");
  const std::int64_t steps_per_eval = trainer.get<std::int64_t>("steps_per_eval");
  const std::int64_t sample_every = trainer.get<std::int64_t>("sample_every");
  const std::int64_t sample_length = trainer.get<std::int64_t>("sample_length");
  const std::int64_t max_eval_batches = trainer.get<std::int64_t>("max_eval_batches");
  const double tokens_per_step = static_cast<double>(run.batch_size * run.seq_len);

  DataParallel& parallel = *run.parallel;
  const bool on_host = c.backend->buffer_type().host_visible();
  TrainStep train_step(c, parallel,
                       StepSettings{run.seed, num_steps, run.micro_size, trainer.get<bool>("overlap_grad_reduce"),
                                    trainer.get<bool>("crash_on_nan"), trainer.get<bool>("crash_on_inf"),
                                    trainer.get<float>("z_loss_weight")});
  // Evaluation and the final save see the weight average when there is one.
  // (FSDP with a whole-matrix optimizer averages the owners' whole copies: the shards follow.)
  auto swap_average = [&] {
    if (!run.state.ema) return;
    run.state.ema->swap();
    if (c.fsdp) c.fsdp->owners_changed();
  };
  auto with_average = [&](auto&& body) {
    swap_average();
    auto result = body();
    swap_average();
    return result;
  };
  // Evaluation and samples see the adapters (merged for the while: any code path of the model).
  auto with_adapters = [&](auto&& body) { return c.lora ? c.lora->with_merged(*c.backend, body) : body(); };
  Sampler sampler(c, trainer, run.seed);
  // Every rank reads trainer.eval_tasks' files: an error all of them meet (a broken file) is
  // printed once, by rank 0, one of a single rank by that rank.
  std::optional<TaskEvaluation> task_evaluation;
  parallel.together([&] { task_evaluation.emplace(c, trainer); });
  // Under FSDP and tensor parallelism every rank runs the model together: the validation loss
  // always, samples under tensor parallelism alone (every member of a tensor group draws the same
  // text through it; rank 0 reports), benchmark tasks under neither yet.
  const bool together = c.fsdp || c.tensor;
  const char* together_name = c.fsdp ? "fully sharded data parallelism" : "tensor parallelism";
  const bool samples_here = c.fsdp ? false : c.tensor ? true : parallel.is_primary();
  if (together && task_evaluation->enabled())
    progress.say(std::string("note: trainer.eval_tasks is not run under ") + together_name +
                 " in this build; score "
                 "the final weights with `loom eval " +
                 run.directory.path().string() + " --tasks ...`");
  if (c.fsdp && sample_length > 0)
    progress.say(std::string("note: samples (trainer.sample_length) are not drawn under ") + together_name +
                 " in this build; `loom generate " + run.directory.path().string() +
                 "` draws them from the final weights");
  // Benchmark tasks (trainer.eval_tasks) on rank 0, with the weights the evaluation sees. The
  // documents were checked against the model at set-up; should an evaluation fail all the same,
  // the run trains on, saves its final weights and checkpoint, and ends with that error: a task
  // evaluation never costs the weights.
  std::exception_ptr task_failure;
  auto evaluate_tasks_now = [&](std::int64_t step) {
    // (Not under FSDP, whose units every rank gathers together: the set-up says so.)
    if (!task_evaluation->enabled() || !parallel.is_primary() || together || task_failure) return;
    try {
      const auto [scalars, line] = with_average([&] { return with_adapters([&] { return task_evaluation->run(); }); });
      for (auto& t : c.trackers) t->log_scalars(step, scalars);
      progress.say("tasks at step " + std::to_string(step) + ": " + line);
    } catch (const std::exception& e) {
      task_failure = std::current_exception();
      progress.say("tasks at step " + std::to_string(step) + " failed: " + e.what() +
                   " (no further task evaluation; the run trains on and saves its weights, then stops with this "
                   "error)");
    }
  };
  // Rank 0 evaluates, samples and writes; the others go on to the next step's reduction.
  const ObjectiveModels models{*c.model, c.reference.get()};
  const std::vector<std::string> metric_names = c.objective->metric_names();
  // A mixture of datasets also has each dataset's own validation loss.
  std::vector<std::pair<std::string, double>> eval_parts;
  auto evaluate_now = [&] {
    eval_parts.clear();
    // Under FSDP (its units are gathered together) and tensor parallelism (every member computes
    // its part) every rank runs the evaluation; rank 0 reports.
    if (!parallel.is_primary() && !together) return Evaluation{};
    Evaluation e = with_average([&] {
      return with_adapters([&] {
        return evaluate(*c.objective, models, *c.backend, *c.dataset, max_eval_batches, run.micro_size, &eval_parts,
                        together ? std::function<void(Ops&)>([&](Ops& ops) {
                          if (c.fsdp) c.fsdp->attach(ops);
                          if (c.tensor) c.tensor->attach(ops);
                        })
                                 : std::function<void(Ops&)>());
      });
    });
    if (c.fsdp) c.fsdp->release();
    return parallel.is_primary() ? e : Evaluation{};
  };
  // The objective's metrics under `prefix` ("train/", "eval/"), by name.
  auto named = [&](const std::string& prefix, const std::vector<double>& values) {
    std::vector<std::pair<std::string, double>> out;
    for (std::size_t i = 0; i < metric_names.size() && i < values.size(); ++i)
      out.emplace_back(prefix + metric_names[i], values[i]);
    return out;
  };
  auto log = [&](std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
    for (auto& t : c.trackers) t->log_scalars(step, scalars);
  };
  auto log_eval = [&](std::int64_t step, const Evaluation& e) {
    // The tracker's scalars and the printed details: the perplexity of a token-level loss, the
    // objective's metrics.
    std::vector<std::pair<std::string, double>> scalars{{"eval/loss", e.loss}};
    std::ostringstream line;
    line << std::fixed;
    if (c.objective->loss_is_token_cross_entropy()) {
      scalars.emplace_back("eval/perplexity", std::exp(e.loss));
      line << "perplexity " << std::setprecision(2) << std::exp(e.loss);
    }
    for (auto& [name, value] : named("eval/", e.metrics)) {
      scalars.emplace_back(name, value);
      line << (line.tellp() > 0 ? ", " : "") << name.substr(5) << " " << std::setprecision(4) << value;
    }
    std::ostringstream parts;
    parts << std::fixed << std::setprecision(4);
    for (const auto& [name, part] : eval_parts) {
      scalars.emplace_back("eval/" + name + "/loss", part);
      parts << (parts.tellp() > 0 ? ", " : "") << name << " " << part;
    }
    log(step, scalars);
    return std::pair{line.str(), parts.str()};
  };

  const auto run_start = Clock::now();
  auto elapsed = [&] {
    return interval.elapsed_before + std::chrono::duration<double>(Clock::now() - run_start).count();
  };

  // Checkpoints: by the policy between steps, on a stop signal, and at the end of a run that has
  // any (so that it can be trained further). Trackers are flushed first: a checkpoint of step N
  // is committed only once every record up to N is on disk.
  // In a data-parallel run whose ranks hold replicas, rank 0 alone writes them (the other ranks
  // have no writer); when the ranks hold different state (ZeRO-1), each writes its own part and
  // the ranks agree on the commit (PartsCommit).
  checkpoint::CheckpointWriter* writer = run.checkpoints.get();
  const bool parts = parallel.writes_checkpoint_parts();
  PartsCommit commit(parallel, writer);
  CheckpointPolicy policy(run.checkpoint, run_start);
  std::int64_t last_saved = run.resumed_from;
  auto report_writes = [&] {
    if (writer)
      for (const auto& r : writer->take_reports()) progress.say(describe_write(r));
  };
  auto save_checkpoint = [&](bool wait) {
    last_saved = state.step;
    policy.saved(Clock::now());
    // Tensor parallelism: every member gathers the whole tensors; rank 0 writes them.
    const auto wholes = gather_whole_entries(run);
    if (!writer) return;
    // The previous checkpoint is committed before the next is written.
    if (parts) commit.settle(/*wait=*/true);
    for (auto& t : c.trackers) t->flush();
    writer->save(live_snapshot(run, train_record(run, elapsed()), &wholes));
    if (parts) {
      commit.started();
      if (wait) commit.settle(/*wait=*/true);
    }
    if (wait) writer->wait();
    report_writes();
  };

  bool reserved = false;
  auto reserve_if_soon = [&] {
    // (Not under tensor parallelism, whose whole tensors are gathered when saving.)
    if (!writer || reserved || c.tensor || !policy.soon(Clock::now())) return;
    writer->reserve(live_snapshot(run, train_record(run, 0)));
    reserved = true;
  };
  reserve_if_soon();

  StopSignals signals(parallel.rank(), parallel.size(), parallel.same_host_peers());
  int stopped_by = 0;
  {
    Prefetcher prefetch(*c.dataset, state.step, num_steps,
                        static_cast<std::size_t>(trainer.get<std::int64_t>("prefetch")));
    Batch batch;
    while (state.step < num_steps) {
      const std::int64_t step = state.step;
      prefetch.take(step, batch);
      if (batch.batch_size != run.batch_size || batch.seq_len != run.seq_len)
        throw InternalError("the dataset returned a " + std::to_string(batch.batch_size) + " x " +
                            std::to_string(batch.seq_len) + " batch for a " + std::to_string(run.batch_size) + " x " +
                            std::to_string(run.seq_len) + " run");
      const auto t0 = Clock::now();
      // The host<->device copies of the step alone (batch in, scalars out, staged collectives),
      // not those of logging, evaluation, samples or checkpoints around it.
      reset_host_device_copies();
      StepResult result;
      try {
        result = train_step.run(batch, state);
      } catch (...) {
        // A NaN or infinite loss or norm: the step that diverged goes to the metrics (JSON's null,
        // a gap in `loom report`'s charts) and to end.json.
        if (const auto& d = train_step.divergence()) {
          log(d->step, {{"train/loss", d->loss}, {"train/grad_norm", d->grad_norm}});
          for (auto& t : c.trackers) t->flush();
          end = RunEnd{"diverged", d->step, num_steps, d->what, d->message};
        }
        throw;
      }
      if (state.ema) state.ema->update();
      const HostDeviceCopies copies = reset_host_device_copies();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      interval.train_seconds += dt;
      interval.seconds += dt;
      interval.loss_sum += result.loss;
      interval.trained_tokens += count_targets(batch.targets);
      ++interval.steps;

      const bool last = step + 1 == num_steps;
      if ((step + 1) % log_every == 0 || last) {
        StepReport report;
        report.step = step + 1;
        report.num_steps = num_steps;
        report.mean_loss = interval.loss_sum / static_cast<double>(interval.steps);
        report.lr = result.lr;
        report.grad_norm = result.grad_norm;
        report.tokens_per_second = tokens_per_step * static_cast<double>(interval.steps) / interval.seconds;
        report.trained_tokens_per_second = static_cast<double>(interval.trained_tokens) / interval.seconds;
        report.mfu = run.flops_per_token * report.tokens_per_second / run.peak_flops;
        report.eta_seconds =
            interval.train_seconds / static_cast<double>(step + 1) * static_cast<double>(num_steps - step - 1);
        report.skipped_steps = state.skipped_steps;
        report.ranks = parallel.size();
        report.mesh = parallel.mesh().describe();
        std::vector<std::pair<std::string, double>> scalars{
            {"train/loss", report.mean_loss},
            {"train/lr", report.lr},
            {"train/grad_norm", report.grad_norm},
            {"throughput/tokens_per_second", report.tokens_per_second},
            {"throughput/trained_tokens_per_second", report.trained_tokens_per_second},
            {"throughput/mfu", report.mfu},
            {"throughput/elapsed_seconds", elapsed()},
            {"train/skipped_steps", static_cast<double>(report.skipped_steps)}};
        // A backend computing in a device's memory: its last step's explicit copies between the
        // host and the device (docs/writing-a-backend.md: a constant of the run's configuration,
        // independent of the model's size).
        if (!on_host) {
          scalars.emplace_back("device/host_copies_per_step", static_cast<double>(copies.count));
          scalars.emplace_back("device/host_copy_bytes_per_step", static_cast<double>(copies.bytes));
        }
        if (parallel.size() > 1) {
          scalars.emplace_back("throughput/ranks", static_cast<double>(parallel.size()));
          const double waiting = parallel.take_communication_seconds() +
                                 (c.fsdp ? c.fsdp->take_communication_seconds() : 0.0) +
                                 (c.tensor ? c.tensor->take_communication_seconds() : 0.0);
          scalars.emplace_back("throughput/communication_share", waiting / interval.seconds);
          // FSDP: the bytes this rank's gathers and reductions moved per step since the last line.
          if (c.fsdp)
            scalars.emplace_back("throughput/fsdp_bytes_per_step",
                                 static_cast<double>(c.fsdp->take_bytes_moved()) /
                                     static_cast<double>(std::max<std::int64_t>(1, interval.steps)));
          // Tensor parallelism: the payload of the model's collectives over the tensor group
          // (activations and their gradients; evaluation's included when it ran).
          if (c.tensor) {
            const auto steps = static_cast<double>(std::max<std::int64_t>(1, interval.steps));
            scalars.emplace_back("throughput/tensor_bytes_per_step",
                                 static_cast<double>(c.tensor->take_bytes_moved()) / steps);
            scalars.emplace_back("throughput/tensor_collectives_per_step",
                                 static_cast<double>(c.tensor->take_collectives()) / steps);
          }
        }
        // The model's own scalars (a mixture of experts' router losses and expert loads).
        for (auto& [name, value] : c.model->metrics()) scalars.emplace_back("model/" + name, value);
        for (auto& entry : named("train/", result.metrics)) scalars.push_back(std::move(entry));
        log(step + 1, scalars);
        progress.step(report);
        summary.final_train_loss = report.mean_loss;
        interval.seconds = 0;
        interval.loss_sum = 0;
        interval.trained_tokens = 0;
        interval.steps = 0;
      }
      if (steps_per_eval > 0 && (step + 1) % steps_per_eval == 0 && !last) {
        const Evaluation e = evaluate_now();
        if (e.loss >= 0) {
          const auto [details, parts] = log_eval(step + 1, e);
          progress.eval(step + 1, e.loss, details);
          if (!parts.empty()) progress.say("  per dataset: " + parts);
        }
      }
      if (task_evaluation->due(step + 1) && !last) evaluate_tasks_now(step + 1);
      if (sample_every > 0 && sample_length > 0 && (step + 1) % sample_every == 0 && !last && samples_here) {
        const std::string text = with_adapters([&] { return sampler.sample(sample_length); });
        for (auto& t : c.trackers) t->log_text(step + 1, "sample", text);
        progress.sample(step + 1, text);
      }
      // A checkpoint whose parts the ranks write is committed at the first step boundary where
      // every part is durable.
      if (commit.pending()) commit.settle(/*wait=*/false);
      report_writes();
      // The last step's checkpoint comes after the final evaluation and weights, below; a signal
      // during the last step lets the run finish.
      if (last) break;
      // mpirun hands a signal to every rank, not necessarily between the same steps: the ranks
      // stop together, at the first step boundary where any of them has one.
      if ((stopped_by = parallel.max_over_ranks(signals.requested())) != 0) {
        // Every rank is here: the checkpoint will be written (one process said so at the signal).
        if (parallel.size() > 1)
          progress.say(std::string(signal_name(stopped_by)) + ": the ranks stop after step " +
                       std::to_string(state.step) + (last_saved != state.step ? ", saving a checkpoint of it" : ""));
        if (last_saved != state.step) save_checkpoint(/*wait=*/true);
        break;
      }
      // A save of parts is collective: the ranks agree on it (the time policy reads each one's clock).
      bool due = policy.due(state.step, Clock::now());
      if (parts) due = parallel.max_over_ranks(due ? 1 : 0) != 0;
      if (due) save_checkpoint(/*wait=*/!run.checkpoint.async);
      reserve_if_soon();
    }
  }
  progress.end_steps();

  if (stopped_by != 0) {
    commit.settle(/*wait=*/true);
    if (writer) writer->wait();
    report_writes();
    for (auto& t : c.trackers) t->flush();
    summary.steps = state.step;
    summary.skipped_steps = state.skipped_steps;
    summary.stopped_by_signal = stopped_by;
    summary.wall_seconds = elapsed();
    progress.say("stopped by " + std::string(signal_name(stopped_by)) + " after step " + std::to_string(state.step) +
                 " of " + std::to_string(num_steps) + "; checkpoint " +
                 (run.checkpoint.dir / checkpoint::CheckpointStore::dir_name(state.step)).string() +
                 " holds it: run the same command again to continue (trainer.resume: auto)");
    if (task_failure) std::rethrow_exception(task_failure);
    return summary;
  }

  summary.steps = num_steps;
  summary.skipped_steps = state.skipped_steps;
  summary.tokens_per_second =
      interval.train_seconds > 0 ? tokens_per_step * static_cast<double>(num_steps) / interval.train_seconds : 0;
  summary.mfu = run.flops_per_token * summary.tokens_per_second / run.peak_flops;

  const Evaluation final_eval = evaluate_now();
  summary.final_eval_loss = final_eval.loss;
  if (summary.final_eval_loss >= 0) {
    const auto [details, parts] = log_eval(num_steps, final_eval);
    progress.final_eval(summary.final_eval_loss, max_eval_batches, details);
    if (!parts.empty()) progress.say("  per dataset: " + parts);
    for (auto& [name, value] : named("", final_eval.metrics)) summary.final_eval_metrics.emplace_back(name, value);
  }
  // (The final task evaluation comes after the final weights and checkpoint, below.)
  if (trainer.get<bool>("save_final") && c.fsdp && !c.lora) {
    // Every rank gathers the units together; rank 0 writes the whole weights.
    std::vector<std::pair<std::string, Tensor>> full = with_average([&] { return c.fsdp->gather_full(); });
    // fsdp x tensor: the tensor group's shards, whole.
    if (c.tensor)
      for (auto& [name, t] : full) t = c.tensor->whole(name, t);
    if (parallel.is_primary()) {
      std::deque<Parameter> values;
      std::vector<ModelParameter> saved;
      for (auto& [name, t] : full) saved.push_back({&values.emplace_back(name, std::move(t))});
      run.directory.save_weights(saved, num_steps, run.state.ema != nullptr);
    }
  } else if (trainer.get<bool>("save_final") && c.tensor) {
    // Every member gathers the whole weights; rank 0 writes them.
    std::vector<std::pair<std::string, Tensor>> full = with_average([&] {
      // Every rank takes part in the gathers; rank 0 alone keeps the whole tensors (a copy of a
      // replicated one: the average is swapped out of the parameters after).
      std::vector<std::pair<std::string, Tensor>> out;
      for (const auto& p : c.model->parameters()) {
        Tensor whole =
            c.tensor->is_split(p.parameter) ? c.tensor->whole(p.parameter->name(), p.parameter->data()) : Tensor();
        if (!parallel.is_primary()) continue;
        out.emplace_back(p.parameter->name(), whole.defined() ? std::move(whole) : p.parameter->data().clone());
      }
      return out;
    });
    if (parallel.is_primary()) {
      std::deque<Parameter> values;
      std::vector<ModelParameter> saved;
      for (auto& [name, t] : full) saved.push_back({&values.emplace_back(name, std::move(t))});
      run.directory.save_weights(saved, num_steps, run.state.ema != nullptr);
    }
  } else if (trainer.get<bool>("save_final") && parallel.is_primary())
    with_average([&] {
      if (c.lora)  // the adapters alone, in PEFT's layout
        c.lora->save_peft(*c.model, run.directory.path(), trainer.get<std::string>("init_from"));
      else
        run.directory.save_weights(c.saved_parameters(), num_steps, run.state.ema != nullptr);
      return 0;
    });
  if (sample_length > 0 && samples_here) {
    summary.final_sample = with_adapters([&] { return sampler.sample(sample_length); });
    for (auto& t : c.trackers) t->log_text(num_steps, "sample", summary.final_sample);
    progress.final_sample(summary.final_sample);
  }
  for (auto& t : c.trackers) t->flush();
  // A run with checkpoints ends with one, so that it can be trained further (a larger
  // trainer.num_train_steps) and a rerun of the same command knows it is finished.
  if (last_saved >= 0 && last_saved != num_steps) save_checkpoint(/*wait=*/true);
  commit.settle(/*wait=*/true);
  if (writer) writer->wait();
  report_writes();
  // The final task evaluation, with everything saved: its failure costs no weights, and a rerun of
  // the same command finds the run finished.
  evaluate_tasks_now(num_steps);
  for (auto& t : c.trackers) t->flush();
  if (task_failure) std::rethrow_exception(task_failure);
  summary.wall_seconds = elapsed();
  summary.peak_resident_bytes = std::int64_t{parallel.max_over_ranks(peak_resident_mib())} << 20;
  progress.done(num_steps, summary.wall_seconds, summary.tokens_per_second, summary.mfu, summary.peak_resident_bytes,
                parallel.size(), summary.run_dir);
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

TrainSummary execute(Run& run, ProgressPrinter& progress) {
  // Rank 0 records how the run ended in end.json. A resumed run removes the record of its earlier
  // end first: while it trains, the directory records no end.
  const bool records = run.parallel->is_primary() && !run.finished;
  if (records) run.directory.clear_end();
  RunEnd end;
  TrainSummary summary;
  try {
    summary = run_steps(run, progress, end);
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
