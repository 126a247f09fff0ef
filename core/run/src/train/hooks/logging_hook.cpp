#include <algorithm>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

LoggingHook::LoggingHook(LoopState& s)
    : Hook(s.run.trainer.get<std::int64_t>("log_every"), /*at_last=*/true),
      s_(s),
      tokens_per_step_(static_cast<double>(s.run.batch_size * s.run.seq_len)),
      on_host_(s.run.components.backend->buffer_type().host_visible()) {}

void LoggingHook::after_step(const StepOutcome& step) {
  Run& run = s_.run;
  RunComponents& c = run.components;
  World& world = *run.world;
  LogInterval& interval = run.state.interval;
  const StepResult& result = *step.result;
  StepReport report;
  report.step = step.step;
  report.num_steps = run.num_steps;
  report.mean_loss = interval.loss_sum / static_cast<double>(interval.steps);
  report.lr = result.lr;
  report.grad_norm = result.grad_norm;
  report.tokens_per_second = tokens_per_step_ * static_cast<double>(interval.steps) / interval.seconds;
  report.trained_tokens_per_second = static_cast<double>(interval.trained_tokens) / interval.seconds;
  report.mfu = run.flops_per_token * report.tokens_per_second / run.peak_flops;
  report.eta_seconds =
      interval.train_seconds / static_cast<double>(step.step) * static_cast<double>(run.num_steps - step.step);
  report.skipped_steps = run.state.skipped_steps;
  report.ranks = world.size();
  report.mesh = world.mesh().describe();
  std::vector<std::pair<std::string, double>> scalars{
      {"train/loss", report.mean_loss},
      {"train/lr", report.lr},
      {"train/grad_norm", report.grad_norm},
      {"throughput/tokens_per_second", report.tokens_per_second},
      {"throughput/trained_tokens_per_second", report.trained_tokens_per_second},
      {"throughput/mfu", report.mfu},
      {"throughput/elapsed_seconds", s_.elapsed()},
      {"train/skipped_steps", static_cast<double>(report.skipped_steps)}};
  // A backend computing in a device's memory: its last step's explicit copies between the host
  // and the device (docs/writing-a-backend.md: a constant of the run's configuration, independent
  // of the model's size).
  if (!on_host_) {
    scalars.emplace_back("device/host_copies_per_step", static_cast<double>(step.copies.count));
    scalars.emplace_back("device/host_copy_bytes_per_step", static_cast<double>(step.copies.bytes));
  }
  if (world.size() > 1) {
    scalars.emplace_back("throughput/ranks", static_cast<double>(world.size()));
    // The strategies' waiting, and their own figures (FSDP's bytes moved; the tensor group's
    // payload and collectives).
    double waiting = 0;
    for (const auto& strategy : c.strategies) waiting += strategy->take_communication_seconds();
    scalars.emplace_back("throughput/communication_share", waiting / interval.seconds);
    for (const auto& strategy : c.strategies) strategy->take_metrics(scalars, interval.steps);
  }
  // The model's own scalars (a mixture of experts' router losses and expert loads).
  for (auto& [name, value] : c.model->metrics()) scalars.emplace_back("model/" + name, value);
  for (auto& entry : s_.named("train/", result.metrics)) scalars.push_back(std::move(entry));
  s_.log(step.step, scalars);
  s_.progress.step(report);
  s_.summary.final_train_loss = report.mean_loss;
  interval.seconds = 0;
  interval.loss_sum = 0;
  interval.trained_tokens = 0;
  interval.steps = 0;
}

}  // namespace loom::training
