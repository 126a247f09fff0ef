// SIGTERM and SIGINT while a run steps: the first asks the step loop to save a checkpoint at the
// next step boundary and stop (a scheduler's preemption notice, or Ctrl-C); a second SIGINT
// stops at once, as SIGINT would have without loom's handler.
//
// In a data-parallel run the launcher sends SIGTERM to every rank both when asked to stop and when
// a rank died (OpenMPI's mpirun: SIGCONT, SIGTERM a second later, then SIGKILL). The ranks save
// only if all of them reach the next step boundary, so the handler says nothing of a checkpoint;
// it looks for the other ranks of this host instead, and when one of them is gone says that the
// run lost a rank and that no checkpoint comes. The step loop announces the checkpoint once the
// ranks have agreed to stop.
#pragma once

#include <span>

#include "train/world.hpp"

namespace loom::training {

class StopSignals {
 public:
  // Installs the handlers (and clears any earlier request). `ranks` > 1: a data-parallel run, of
  // which this process is rank `rank` and `peers` are this host's other ranks.
  explicit StopSignals(int rank = 0, int ranks = 1, std::span<const PeerProcess> peers = {});
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
