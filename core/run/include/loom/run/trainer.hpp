// The trainer: `loom train CONFIG [overrides]`.
//
// Builds every component of a run from the resolved config through the registry (backend,
// tokenizer, dataset, model with its attention kernel, optimizer, learning-rate schedule,
// trackers), then runs trainer.num_train_steps steps:
//
//   for each step:  batch (prefetched on another thread while the previous step ran)
//                   -> for each micro-batch: forward, loss, backward (gradients accumulate)
//                   -> global gradient norm -> NaN/Inf check -> skip-bad-step check -> clip
//                   -> optimizer step with the scheduled learning rate
//                   -> the hooks, each at its interval: metrics (loss, lr, grad norm, tokens/s,
//                      MFU) to the trackers and the terminal every log_every; validation loss every
//                      steps_per_eval; benchmark tasks every steps_per_task_eval; a sample every
//                      sample_every; the checkpoint commit; the hooks of Trainer::add_hook; stop
//                      signals; the checkpoint policy
//   then the final evaluation, weights, sample, checkpoint and task evaluation.
//
// Everything is deterministic for a given config, seed and thread count: initialisation,
// data order and dropout draw from separate counter-based streams of trainer.seed.
//
// Checkpoints (trainer.checkpoint, docs/checkpoints.md) are written between steps, by a
// background thread from a snapshot; trainer.resume continues a run from one so exactly that
// the resumed run ends with the same weights, byte for byte, as one never interrupted. SIGTERM
// and SIGINT save a checkpoint at the next step boundary and stop the run.
//
// The parts, one concern per file under core/run/src/train/: run_setup (config to a run ready to
// step, in named stages), components, run_directory (config.yaml, tokenizer.state, weights, the
// lock), resume, step_loop (batch, step, hooks, stop), hooks/ (each concern between steps and at
// the end: logging, validation, task evaluation, samples, checkpoints, stop signals, the final
// weights), checkpointing (with core/run/src/checkpoint/: the store, its protocol, the writer
// thread), stop_signals, prefetcher, train_step (with train_state: what a checkpoint must
// capture), micro_batches, evaluation, sampling, progress (the terminal).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <iosfwd>
#include <string>
#include <utility>
#include <vector>

#include "loom/core/runtime.hpp"
#include "loom/error.hpp"
#include "loom/tensor.hpp"

namespace loom {

// The schema of the `trainer` section (also part of run_config_schema()).
OptionSchema trainer_schema();

struct TrainSummary {
  std::string run_dir;
  std::int64_t steps = 0;
  double final_train_loss = 0;  // mean over the last log interval
  double final_eval_loss = -1;  // -1 when there was no evaluation
  // The objective's metrics at the final evaluation ("reward_accuracy" for dpo); none for causal_lm.
  std::vector<std::pair<std::string, double>> final_eval_metrics;
  double wall_seconds = 0;
  double tokens_per_second = 0;  // over the whole run, evaluation excluded
  double mfu = 0;                // model FLOPs utilisation over the whole run
  double peak_flops = 0;         // the roof MFU is measured against
  // Peak resident memory of the process (of the largest rank in a data-parallel run), in bytes.
  std::int64_t peak_resident_bytes = 0;
  std::int64_t skipped_steps = 0;
  std::string final_sample;
  std::int64_t resumed_from_step = -1;  // the checkpoint's step when the run resumed, else -1
  bool already_finished = false;        // resumed at its last step: nothing was trained
  // SIGTERM or SIGINT when a signal stopped the run after saving a checkpoint (steps = the
  // checkpoint's step); 0 otherwise. `loom train` then exits with status 128 + the signal.
  int stopped_by_signal = 0;
};

struct TrainOptions {
  std::ostream* out = nullptr;  // progress and log lines (stdout when null)
  // Whether `out` is a terminal: a live progress line instead of plain log lines.
  bool interactive = false;
  // How the caller prints an error (the `loom` command's "loom: error: ..."). A data-parallel
  // run prints an error through it once, on the rank that had it (rank 0 when every rank had
  // the same), and then throws ReportedError on every rank. Null: each rank throws its own.
  std::function<void(const Error&)> report_error;
};

// What train() throws on every rank of a data-parallel run once an error has been printed
// through TrainOptions::report_error: the caller exits with the status of its kind (2 for a user
// error) and prints nothing more. Its message names the rank that reported the error.
class ReportedError : public Error {
 public:
  ReportedError(ErrorKind kind, std::string message) : Error(kind, std::move(message)) {}
  ~ReportedError() override;
};

// An error `loom train` met before its ranks could agree on errors (reading the config file, its
// includes and overrides: before a Runtime exists). Under OpenMPI's mpirun with several ranks, the
// rank connects through the default collective (`mpi`, found on `runtime`'s plugin paths, without
// the config's) and the ranks agree on the error as on any of the set-up (train() meets them
// there): one every rank met is printed once, by rank 0, one of a single rank by that rank; then
// ReportedError is thrown. Where the rank cannot connect (one process, no `mpi` plugin), `error`
// itself is thrown, for the caller to print.
[[noreturn]] void agree_on_start_up_error(const Error& error, const RuntimeOptions& runtime,
                                          const TrainOptions& options);

// What a hook added with Trainer::add_hook is given after a step: the step's figures and where
// the run stands. Valid during the call only.
struct StepInfo {
  std::int64_t step = 0;       // steps done: the number of the step just run, counting from 1
  std::int64_t num_steps = 0;  // trainer.num_train_steps
  double loss = 0;             // the step's loss, over the whole batch (every rank's rows)
  double lr = 0;               // the scheduled learning rate of the step
  double grad_norm = 0;        // global, before clipping
  bool skipped = false;        // its update was not applied (trainer.skip_bad_steps, a non-finite norm)
  // The objective's metrics over the batch, as the trackers name them ("train/reward_accuracy").
  std::vector<std::pair<std::string, double>> metrics;
  int rank = 0;  // this process's, of `ranks` (a data-parallel run: every rank calls its hooks)
  int ranks = 1;
  std::string run_dir;         // the run directory
  std::string checkpoint_dir;  // where its checkpoints go (trainer.checkpoint.dir)
  // The step of the last checkpoint this run handed to its writer, or the one it resumed from;
  // -1: none. (Written in the background unless trainer.checkpoint.async is false.)
  std::int64_t last_checkpoint_step = -1;
};
using TrainHook = std::function<void(const StepInfo&)>;

// A training run with hooks of the caller's between its steps (Levanter's
// `trainer.add_hook(fn, every=N)`); train(runtime, options) is Trainer(runtime, options).train().
//
// The run's own concerns are hooks of the same loop, each at its interval (logging, validation,
// task evaluation, samples, the checkpoint commit, stop signals, the checkpoint policy); an added
// hook runs after the run's logging, evaluations, samples and checkpoint commit of that step, and
// before the stop-signal check and the checkpoint policy, so that a signal a hook raises stops the
// run after this very step, and a checkpoint the policy saves at a step comes after the hooks.
// Hooks added together run in the order they were added.
//
// A hook is called on the thread that called train(), between two steps: nothing of the run runs
// meanwhile but the checkpoint writer and the batch prefetcher, neither of which waits for it. It
// may read what it is given and the run directory, and may raise SIGTERM or SIGINT (the run then
// stops after this step, with a checkpoint, as when a scheduler sends it; under mpirun the ranks
// agree on it); it must not change the run's state. An exception it throws ends the run with that
// error (end.json records it) as any error of a step does. In a data-parallel run every rank calls
// its own hooks, at the same steps; a hook that throws on some ranks only leaves the others in the
// step's collectives until the launcher ends them, so it throws on every rank or on none. A run
// resumed at its last step (nothing to train) calls no hook.
class Trainer {
 public:
  // `runtime` must outlive the Trainer.
  explicit Trainer(Runtime& runtime, TrainOptions options = {});

  // Calls `hook` after each step whose number (steps done, counting from 1) is a multiple of
  // `every` (>= 1), the run's last step included when it is one. Before train() only.
  Trainer& add_hook(TrainHook hook, std::int64_t every = 1);

  // Sets up and runs the training described by the runtime's config. Throws UserError for a bad
  // config or data, and for a diverged run when crash_on_nan / crash_on_inf are set.
  TrainSummary train();

 private:
  Runtime& runtime_;
  TrainOptions options_;
  std::vector<std::pair<TrainHook, std::int64_t>> hooks_;
};

// Runs the training described by runtime's config: Trainer(runtime, options).train(). Throws
// UserError for a bad config or data, and for a diverged run when crash_on_nan / crash_on_inf are
// set.
TrainSummary train(Runtime& runtime, const TrainOptions& options = {});

// Levanter's skip-step rule (SkipStepConfig): once the window holds max(2, window / 2) past
// steps, a step whose loss or gradient norm exceeds that history's mean + sigma * std
// (population std, floored at 1e-6) is skipped. Every step with a finite loss and gradient norm,
// skipped or not, enters the window, which keeps the last window + 1 steps. A step whose loss or
// norm is NaN or infinite is skipped and never enters the window: one such value would make the
// mean, and with it every threshold, NaN or infinite for the next window + 1 steps.
class SkipStepRule {
 public:
  SkipStepRule(std::int64_t window, double sigma);
  // Decides for the current step, then records it.
  bool should_skip(double loss, double grad_norm);

  // The window, oldest first (what a checkpoint saves), and its restoration.
  std::vector<double> losses() const { return {losses_.begin(), losses_.end()}; }
  std::vector<double> grad_norms() const { return {norms_.begin(), norms_.end()}; }
  // Throws UserError when the two differ in length or exceed the window. Steps with a non-finite
  // loss or norm (which checkpoints of older versions may hold) are dropped.
  void restore(const std::vector<double>& losses, const std::vector<double>& grad_norms);

 private:
  double threshold(const std::deque<double>& xs) const;
  void push(std::deque<double>& xs, double x);
  std::size_t capacity_;
  double sigma_;
  std::deque<double> losses_, norms_;
};

// Model FLOPs the machine can do per second, measured by a short GEMM probe on `backend` (what
// the MFU figure is relative to when trainer.peak_flops is unset).
struct PeakFlops {
  // The precision the run's matrix products compute in: Backend::matmul_dtype() (f32, or bf16
  // with the cpu backend's matmul_precision: auto on a CPU with AVX512-BF16, or bf16).
  DType compute = DType::f32;
  // The roof of the run's own matrix products, in `compute`: Backend::gemm_bf16's when the
  // backend computes in bf16, Backend::gemm's when in float32.
  double matmul = 0;
  // Backend::gemm_bf16's where the backend has bf16 kernels (supports_op(gemm, bf16)), else 0;
  // equal to `matmul` when `compute` is bf16.
  double bf16 = 0;
};
PeakFlops probe_peak_flops(class Backend& backend);

}  // namespace loom
