// The run's own hooks, in the order the step loop runs them after a step (what a step prints
// comes in that order): logging, the validation loss, task evaluation, samples, the commit of a
// checkpoint the ranks write in parts, the hooks added through Trainer::add_hook, stop signals,
// the checkpoint policy. At the end of a run that trained its last step: the final evaluation,
// the final weights, the final sample, the final checkpoint, the final task evaluation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "loom/run/trainer.hpp"
#include "train/checkpointing.hpp"
#include "train/evaluation.hpp"
#include "train/hooks/hook.hpp"
#include "train/sampling.hpp"
#include "train/stop_signals.hpp"
#include "train/task_evaluation.hpp"

namespace loom::training {

// Trackers and the terminal: the interval's figures every trainer.log_every steps and after the
// last step (train/, throughput/, device/, model/ scalars; the progress line).
class LoggingHook : public Hook {
 public:
  explicit LoggingHook(LoopState& s);
  void after_step(const StepOutcome& step) override;

 private:
  LoopState& s_;
  double tokens_per_step_;
  bool on_host_;  // the backend computes in host memory: no host<->device copies to report
};

// The validation loss every trainer.steps_per_eval steps before the last, and the final one.
// Rank 0 reports; under FSDP and tensor parallelism every rank computes it.
class ValidationHook : public Hook {
 public:
  explicit ValidationHook(LoopState& s);
  void after_step(const StepOutcome& step) override;
  // The final evaluation, into the summary.
  void final();

 private:
  Evaluation evaluate();
  // Logs `e` to the trackers; returns the printed details and the per-dataset losses.
  std::pair<std::string, std::string> log(std::int64_t step, const Evaluation& e) const;
  LoopState& s_;
  std::int64_t max_batches_;
  // A mixture of datasets also has each dataset's own validation loss.
  std::vector<std::pair<std::string, double>> parts_;
};

// Benchmark tasks (trainer.eval_tasks) on rank 0 every trainer.steps_per_task_eval steps before
// the last, and once everything is saved at the end, with the weights the evaluation sees. The
// documents were checked against the model at set-up; should an evaluation fail all the same,
// the run trains on, saves its final weights and checkpoint, and ends with that error
// (LoopState::task_failure): a task evaluation never costs the weights.
class TaskEvaluationHook : public Hook {
 public:
  explicit TaskEvaluationHook(LoopState& s);
  bool due(const StepOutcome& step) const override { return !step.last && tasks_->due(step.step); }
  void after_step(const StepOutcome& step) override { evaluate(step.step); }
  void final() { evaluate(s_.run.num_steps); }

 private:
  void evaluate(std::int64_t step);
  LoopState& s_;
  std::optional<TaskEvaluation> tasks_;
};

// A text sample every trainer.sample_every steps before the last, and the final one, where this
// rank draws them (rank 0; every member of a tensor group; none under FSDP).
class SampleHook : public Hook {
 public:
  explicit SampleHook(LoopState& s);
  void after_step(const StepOutcome& step) override;
  // The final sample, into the summary.
  void final();

 private:
  LoopState& s_;
  Sampler sampler_;
  std::int64_t length_;
};

// The run's checkpoints: by the policy between steps, on a stop signal, and at the end of a run
// that has any (so that it can be trained further). Trackers are flushed first: a checkpoint of
// step N is committed only once every record up to N is on disk. In a data-parallel run whose
// ranks hold replicas, rank 0 alone writes them (the other ranks have no writer); when the ranks
// hold different state (ZeRO-1, FSDP), each writes its own part and the ranks agree on the commit
// (PartsCommit). Not a hook itself: the hooks below and StopSignalHook save through it.
class Checkpoints {
 public:
  // The policy's clock starts at s.start.
  explicit Checkpoints(LoopState& s);
  // A checkpoint of the run as it stands, from every rank; `wait`: written and committed on return.
  void save(bool wait);
  // Lets the writer prepare its buffers when a save may come soon.
  void reserve_if_soon();
  // A checkpoint whose parts the ranks write is committed at the first step boundary where every
  // part is durable; what the writer finished is reported.
  void settle();
  // Every checkpoint handed to the writer committed, and reported.
  void finish();
  // The end of a run that trained its last step: a checkpoint of it (when the run has any), then
  // finish().
  void final();

  bool writes_parts() const { return parts_; }
  std::int64_t last_saved() const { return last_saved_; }
  bool due(Clock::time_point now) const { return policy_.due(s_.run.state.step, now); }

 private:
  void report_writes();
  LoopState& s_;
  checkpoint::CheckpointWriter* writer_;
  CheckpointWriting writing_;  // how the ranks write a checkpoint (the strategies' say)
  bool parts_;
  PartsCommit commit_;
  CheckpointPolicy policy_;
  std::int64_t last_saved_;
  bool reserved_ = false;
};

// After every step, the last included: Checkpoints::settle.
class CheckpointCommitHook : public Hook {
 public:
  explicit CheckpointCommitHook(Checkpoints& checkpoints) : Hook(1, /*at_last=*/true), checkpoints_(checkpoints) {}
  void after_step(const StepOutcome&) override { checkpoints_.settle(); }

 private:
  Checkpoints& checkpoints_;
};

// The save policy (trainer.checkpoint: every_steps, minutes, keep_every_steps), checked after
// every step before the last (whose checkpoint is Checkpoints::final) unless the run stops.
class CheckpointPolicyHook : public Hook {
 public:
  CheckpointPolicyHook(LoopState& s, Checkpoints& checkpoints);
  bool due(const StepOutcome& step) const override { return !step.last && s_.stopped_by == 0; }
  void after_step(const StepOutcome& step) override;

 private:
  LoopState& s_;
  Checkpoints& checkpoints_;
};

// SIGTERM and SIGINT (train/stop_signals.hpp), checked after every step before the last (a
// signal during the last step lets the run finish). mpirun hands a signal to every rank, not
// necessarily between the same steps: the ranks stop together, at the first step boundary where
// any of them has one, with a checkpoint of that step (LoopState::stopped_by).
class StopSignalHook : public Hook {
 public:
  StopSignalHook(LoopState& s, Checkpoints& checkpoints);
  void after_step(const StepOutcome& step) override;
  // The end of a run a signal stopped: its checkpoint committed, the summary and the message.
  void final();

 private:
  LoopState& s_;
  Checkpoints& checkpoints_;
  StopSignals signals_;
};

// A hook of Trainer::add_hook: after every `every`-th step, the last one included.
class AddedHook : public Hook {
 public:
  AddedHook(LoopState& s, const Checkpoints& checkpoints, TrainHook hook, std::int64_t every)
      : Hook(every), s_(s), checkpoints_(checkpoints), hook_(std::move(hook)), every_(every) {}
  bool due(const StepOutcome& step) const override { return step.step % every_ == 0; }
  void after_step(const StepOutcome& step) override;

 private:
  LoopState& s_;
  const Checkpoints& checkpoints_;
  TrainHook hook_;
  std::int64_t every_;
};

// The final weights (trainer.save_final) into the run directory, with the weights the evaluation
// saw: model.safetensors, whole (FSDP's units and tensor parallelism's shards gathered by every
// rank, written by rank 0), or under LoRA the adapters alone in PEFT's layout.
void save_final_weights(LoopState& s);

}  // namespace loom::training
