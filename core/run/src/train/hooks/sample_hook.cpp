#include <optional>

#include "train/hooks/run_hooks.hpp"

namespace loom::training {

namespace {

// Whether the strategies let samples be drawn (train/strategy.hpp): under FSDP not yet; under
// tensor parallelism every member of a tensor group draws the same text (rank 0 reports).
std::optional<bool> strategies_draw(const Run& run) {
  for (const auto& strategy : run.components.strategies)
    if (const std::optional<bool> draws = strategy->draws_samples()) return draws;
  return std::nullopt;
}

// Whether this rank draws the samples: rank 0, unless a strategy says otherwise.
bool samples_here(const Run& run) {
  return strategies_draw(run).value_or(run.world->is_primary());
}

std::int64_t sample_interval(const Run& run) {
  return run.trainer.get<std::int64_t>("sample_length") > 0 && samples_here(run)
             ? run.trainer.get<std::int64_t>("sample_every")
             : 0;
}

}  // namespace

SampleHook::SampleHook(LoopState& s)
    : Hook(sample_interval(s.run)),
      s_(s),
      sampler_(s.run.components, s.run.trainer, s.run.seed),
      length_(s.run.trainer.get<std::int64_t>("sample_length")) {
  if (strategies_draw(s.run) == false && length_ > 0)
    s.progress.say(std::string("note: samples (trainer.sample_length) are not drawn under ") + s.together_name +
                   " in this build; `loom generate " + s.run.directory.path().string() +
                   "` draws them from the final weights");
}

void SampleHook::after_step(const StepOutcome& step) {
  const std::string text = s_.views.with_adapters([&] { return sampler_.sample(length_); });
  for (auto& t : s_.run.components.trackers) t->log_text(step.step, "sample", text);
  s_.progress.sample(step.step, text);
}

void SampleHook::final() {
  if (length_ <= 0 || !samples_here(s_.run)) return;
  TrainSummary& summary = s_.summary;
  summary.final_sample = s_.views.with_adapters([&] { return sampler_.sample(length_); });
  for (auto& t : s_.run.components.trackers) t->log_text(s_.run.num_steps, "sample", summary.final_sample);
  s_.progress.final_sample(summary.final_sample);
}

}  // namespace loom::training
