#include "train/hooks/run_hooks.hpp"

namespace loom::training {

namespace {

// Whether this rank draws the samples: rank 0; under tensor parallelism every member of a tensor
// group draws the same text through it (rank 0 reports); under FSDP none yet.
bool samples_here(const Run& run) {
  return run.components.fsdp ? false : run.components.tensor ? true : run.parallel->is_primary();
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
  if (s.run.components.fsdp && length_ > 0)
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
