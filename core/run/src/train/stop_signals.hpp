// SIGTERM and SIGINT while a run steps: the first asks the step loop to save a checkpoint at the
// next step boundary and stop (a scheduler's preemption notice, or Ctrl-C); a second SIGINT
// stops at once, as SIGINT would have without loom's handler.
#pragma once

namespace loom::training {

class StopSignals {
 public:
  // Installs the handlers (and clears any earlier request).
  StopSignals();
  // Restores the handlers that were there before.
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The signal that asked the run to stop (SIGTERM or SIGINT), or 0.
  int requested() const;
};

// "SIGTERM", "SIGINT".
const char* signal_name(int signal);

}  // namespace loom::training
