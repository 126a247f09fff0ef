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
//                   -> metrics (loss, lr, grad norm, tokens/s, MFU) to the trackers and the terminal
//                   -> every steps_per_eval: validation loss; every sample_every: a sample
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
// step), components, run_directory (config.yaml, tokenizer.state, weights, the lock), resume,
// step_loop, checkpointing (with core/run/src/checkpoint/: the store, its protocol, the writer
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

// Runs the training described by runtime's config. Throws UserError for a bad config or data,
// and for a diverged run when crash_on_nan / crash_on_inf are set.
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
