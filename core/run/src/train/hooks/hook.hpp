// What runs between the steps of a run and at its end (step_loop.cpp): logging, the validation
// loss, task evaluation, samples, checkpoints, stop signals and the final weights, each a hook
// that owns its interval, and the state they share.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "loom/device.hpp"
#include "loom/run/trainer.hpp"
#include "train/progress.hpp"
#include "train/run_setup.hpp"
#include "train/train_step.hpp"

namespace loom::training {

using Clock = std::chrono::steady_clock;

// The step just run, as the hooks see it.
struct StepOutcome {
  std::int64_t step = 0;  // steps done: the step's number, counting from 1
  bool last = false;      // the run's last step
  const StepResult* result = nullptr;
  HostDeviceCopies copies;  // the step's own copies between the host and the device
};

// Evaluation, samples and the final weights see the weight average (trainer.ema_decay) when there
// is one, and the adapters (LoRA) merged for the while: any code path of the model.
class ModelViews {
 public:
  explicit ModelViews(Run& run) : run_(run) {}
  template <class Body>
  auto with_average(Body&& body) {
    swap_average();
    auto result = body();
    swap_average();
    return result;
  }
  template <class Body>
  auto with_adapters(Body&& body) {
    RunComponents& c = run_.components;
    return c.lora ? c.lora->with_merged(*c.backend, body) : body();
  }

 private:
  // (FSDP with a whole-matrix optimizer averages the owners' whole copies: the shards follow.)
  void swap_average() {
    if (!run_.state.ema) return;
    run_.state.ema->swap();
    for (const auto& strategy : run_.components.strategies) strategy->parameters_swapped();
  }
  Run& run_;
};

// What the hooks share: the run, where it reports, what it will return, and what one hook
// decides for the others (a stop, a task evaluation's failure).
struct LoopState {
  LoopState(Run& run, ProgressPrinter& progress, TrainSummary& summary);

  Run& run;
  ProgressPrinter& progress;
  TrainSummary& summary;
  ModelViews views;
  // Under FSDP and tensor parallelism every rank runs the model together: the validation loss
  // always, samples under tensor parallelism alone, benchmark tasks under neither yet.
  bool together = false;
  const char* together_name = "";
  Clock::time_point start;  // of this part of the run (the steps' clocks start there)
  // The signal the ranks agreed to stop on (StopSignalHook), or 0.
  int stopped_by = 0;
  // A task evaluation's failure: the run trains on, saves its weights, and ends with it.
  std::exception_ptr task_failure;

  // Wall time of the whole run: its earlier parts (before a resume) and this one.
  double elapsed() const;
  // To every tracker.
  void log(std::int64_t step, const std::vector<std::pair<std::string, double>>& scalars) const;
  void flush_trackers() const;
  // The objective's metrics under `prefix` ("train/", "eval/"), by name.
  std::vector<std::pair<std::string, double>> named(const std::string& prefix, const std::vector<double>& values) const;
};

// A hook runs after the steps its interval names: every `every` steps (0: never between steps),
// and after the last step when `at_last` (the end of a run has each hook's final act instead,
// called by the step loop in its own order).
class Hook {
 public:
  explicit Hook(std::int64_t every, bool at_last = false) : every_(every), at_last_(at_last) {}
  virtual ~Hook() = default;
  Hook(const Hook&) = delete;
  Hook& operator=(const Hook&) = delete;

  virtual bool due(const StepOutcome& step) const {
    return step.last ? at_last_ : every_ > 0 && step.step % every_ == 0;
  }
  virtual void after_step(const StepOutcome& step) = 0;

 private:
  std::int64_t every_;
  bool at_last_;
};

}  // namespace loom::training
