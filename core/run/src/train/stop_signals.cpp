#include "train/stop_signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

namespace loom::training {

namespace {

volatile std::sig_atomic_t g_requested = 0;
struct sigaction g_previous_int, g_previous_term;

void say(const char* text) {
  // write(2) is async-signal-safe; what it returns changes nothing here.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

void on_signal(int signal) {
  if (g_requested != 0) {
    if (signal != SIGINT) return;
    say("\nloom: second SIGINT: stopping now, without a checkpoint\n");
    ::signal(SIGINT, SIG_DFL);
    ::raise(SIGINT);
    return;
  }
  g_requested = signal;
  say(signal == SIGINT ? "\nloom: SIGINT: saving a checkpoint at the end of this step, then stopping "
                         "(press Ctrl-C again to stop at once)\n"
                       : "\nloom: SIGTERM: saving a checkpoint at the end of this step, then stopping\n");
}

}  // namespace

StopSignals::StopSignals() {
  g_requested = 0;
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &action, &g_previous_int);
  ::sigaction(SIGTERM, &action, &g_previous_term);
}

StopSignals::~StopSignals() {
  ::sigaction(SIGINT, &g_previous_int, nullptr);
  ::sigaction(SIGTERM, &g_previous_term, nullptr);
}

int StopSignals::requested() const {
  return g_requested;
}

const char* signal_name(int signal) {
  return signal == SIGINT ? "SIGINT" : signal == SIGTERM ? "SIGTERM" : "a signal";
}

}  // namespace loom::training
