#include "train/step_loop.hpp"

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loom/error.hpp"
#include "train/evaluation.hpp"
#include "train/prefetcher.hpp"
#include "train/sampling.hpp"
#include "train/train_step.hpp"

namespace loom::training {

using Clock = std::chrono::steady_clock;

TrainSummary execute(Run& run, ProgressPrinter& progress) {
  TrainSummary summary;
  summary.run_dir = run.directory.path().string();
  summary.peak_flops = run.peak_flops;

  const Options& trainer = run.trainer;
  RunComponents& c = run.components;
  const std::int64_t num_steps = run.num_steps;
  const std::int64_t log_every = trainer.get<std::int64_t>("log_every");
  const std::int64_t steps_per_eval = trainer.get<std::int64_t>("steps_per_eval");
  const std::int64_t sample_every = trainer.get<std::int64_t>("sample_every");
  const std::int64_t sample_length = trainer.get<std::int64_t>("sample_length");
  const std::int64_t max_eval_batches = trainer.get<std::int64_t>("max_eval_batches");
  const double tokens_per_step = static_cast<double>(run.batch_size * run.seq_len);

  TrainStep train_step(c, StepSettings{run.seed, num_steps, run.micro_size, trainer.get<bool>("crash_on_nan"),
                                       trainer.get<bool>("crash_on_inf"), trainer.get<float>("z_loss_weight")});
  if (const double decay = trainer.get<double>("ema_decay"); decay > 0 && !run.state.ema)
    run.state.ema = std::make_shared<ParameterEma>(decay, c.parameters, *c.backend);
  // Evaluation and the final save see the weight average when there is one.
  auto with_average = [&](auto&& body) {
    if (run.state.ema) run.state.ema->swap();
    auto result = body();
    if (run.state.ema) run.state.ema->swap();
    return result;
  };
  Sampler sampler(c, trainer, run.seed);
  auto evaluate_now = [&] {
    return with_average([&] { return evaluate(*c.model, *c.backend, *c.dataset, max_eval_batches, run.micro_size); });
  };
  auto log = [&](std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
    for (auto& t : c.trackers) t->log_scalars(step, scalars);
  };

  Prefetcher prefetch(*c.dataset, run.state.step, num_steps,
                      static_cast<std::size_t>(trainer.get<std::int64_t>("prefetch")));
  Batch batch;
  double train_seconds = 0, interval_seconds = 0, interval_loss = 0;
  std::int64_t interval_steps = 0;
  const auto run_start = Clock::now();

  while (run.state.step < num_steps) {
    const std::int64_t step = run.state.step;
    prefetch.take(step, batch);
    if (batch.batch_size != run.batch_size || batch.seq_len != run.seq_len)
      throw InternalError("the dataset returned a " + std::to_string(batch.batch_size) + " x " +
                          std::to_string(batch.seq_len) + " batch for a " + std::to_string(run.batch_size) + " x " +
                          std::to_string(run.seq_len) + " run");
    const auto t0 = Clock::now();
    const StepResult result = train_step.run(batch, run.state);
    if (run.state.ema) run.state.ema->update();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    train_seconds += dt;
    interval_seconds += dt;
    interval_loss += result.loss;
    ++interval_steps;

    const bool last = step + 1 == num_steps;
    if ((step + 1) % log_every == 0 || last) {
      StepReport report;
      report.step = step + 1;
      report.num_steps = num_steps;
      report.mean_loss = interval_loss / static_cast<double>(interval_steps);
      report.lr = result.lr;
      report.grad_norm = result.grad_norm;
      report.tokens_per_second = tokens_per_step * static_cast<double>(interval_steps) / interval_seconds;
      report.mfu = run.flops_per_token * report.tokens_per_second / run.peak_flops;
      report.eta_seconds = train_seconds / static_cast<double>(step + 1) * static_cast<double>(num_steps - step - 1);
      report.skipped_steps = run.state.skipped_steps;
      const double elapsed = std::chrono::duration<double>(Clock::now() - run_start).count();
      log(step + 1, {{"train/loss", report.mean_loss},
                     {"train/lr", report.lr},
                     {"train/grad_norm", report.grad_norm},
                     {"throughput/tokens_per_second", report.tokens_per_second},
                     {"throughput/mfu", report.mfu},
                     {"throughput/elapsed_seconds", elapsed},
                     {"train/skipped_steps", static_cast<double>(report.skipped_steps)}});
      progress.step(report);
      summary.final_train_loss = report.mean_loss;
      interval_seconds = 0;
      interval_loss = 0;
      interval_steps = 0;
    }
    if (steps_per_eval > 0 && (step + 1) % steps_per_eval == 0 && !last) {
      const double eval_loss = evaluate_now();
      if (eval_loss >= 0) {
        log(step + 1, {{"eval/loss", eval_loss}, {"eval/perplexity", std::exp(eval_loss)}});
        progress.eval(step + 1, eval_loss);
      }
    }
    if (sample_every > 0 && sample_length > 0 && (step + 1) % sample_every == 0 && !last) {
      const std::string text = sampler.sample(sample_length);
      for (auto& t : c.trackers) t->log_text(step + 1, "sample", text);
      progress.sample(step + 1, text);
    }
  }
  progress.end_steps();

  summary.steps = num_steps;
  summary.skipped_steps = run.state.skipped_steps;
  summary.tokens_per_second = tokens_per_step * static_cast<double>(num_steps) / train_seconds;
  summary.mfu = run.flops_per_token * summary.tokens_per_second / run.peak_flops;

  summary.final_eval_loss = evaluate_now();
  if (summary.final_eval_loss >= 0) {
    log(num_steps, {{"eval/loss", summary.final_eval_loss}, {"eval/perplexity", std::exp(summary.final_eval_loss)}});
    progress.final_eval(summary.final_eval_loss, max_eval_batches);
  }
  if (trainer.get<bool>("save_final"))
    with_average([&] {
      run.directory.save_weights(c.parameters, num_steps);
      return 0;
    });
  if (sample_length > 0) {
    summary.final_sample = sampler.sample(sample_length);
    for (auto& t : c.trackers) t->log_text(num_steps, "sample", summary.final_sample);
    progress.final_sample(summary.final_sample);
  }
  for (auto& t : c.trackers) t->flush();
  summary.wall_seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  progress.done(num_steps, summary.wall_seconds, summary.tokens_per_second, summary.mfu, summary.run_dir);
  return summary;
}

}  // namespace loom::training
