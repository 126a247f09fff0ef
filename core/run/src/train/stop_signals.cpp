#include "train/stop_signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>

namespace loom::training {

namespace {

volatile std::sig_atomic_t g_requested = 0;
struct sigaction g_previous_int, g_previous_term;
// The run's shape, for the handler (set before it is installed).
bool g_data_parallel = false;
int g_rank = 0;
constexpr std::size_t kMaxPeers = 1024;
PeerProcess g_peers[kMaxPeers];
std::size_t g_peer_count = 0;

void say(const char* text) {
  // write(2) is async-signal-safe; what it returns changes nothing here.
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, text, std::strlen(text));
}

// `value` in decimal, in `out` (at least 12 chars), without snprintf (not async-signal-safe).
const char* decimal(int value, char* out) {
  char digits[12];
  int n = 0;
  unsigned v = value < 0 ? 0u : static_cast<unsigned>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 11);
  for (int i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  out[n] = '\0';
  return out;
}

// A data-parallel run: whether a rank of this host is gone (kill(pid, 0) fails with ESRCH: its
// launcher has reaped it before it signals the others). Says so, and which, when it is: the
// first rank gone, said by the lowest rank of this host still there.
bool say_if_a_peer_is_gone(const char* signal) {
  const int saved_errno = errno;
  std::size_t lost = g_peer_count;
  bool lowest = true;
  for (std::size_t i = 0; i < g_peer_count; ++i) {
    const bool alive = ::kill(g_peers[i].pid, 0) == 0 || errno != ESRCH;
    if (!alive && lost == g_peer_count) lost = i;
    if (alive && g_peers[i].rank < g_rank) lowest = false;
  }
  const bool gone = lost < g_peer_count;
  if (gone && lowest) {
    char rank[12], pid[12];
    say("\nloom: ");
    say(signal);
    say(": rank ");
    say(decimal(g_peers[lost].rank, rank));
    say(" of this run (pid ");
    say(decimal(g_peers[lost].pid, pid));
    say(") is gone, so the launcher is ending the other ranks: the run lost a rank and saves no checkpoint here "
        "(the last one written stays; run the same command again to continue from it)\n");
  }
  errno = saved_errno;
  return gone;
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
  if (g_data_parallel) {
    // The step loop says more once the ranks agree to stop; a lost rank is said now.
    say_if_a_peer_is_gone(signal == SIGINT ? "SIGINT" : "SIGTERM");
    return;
  }
  say(signal == SIGINT ? "\nloom: SIGINT: saving a checkpoint at the end of this step, then stopping "
                         "(press Ctrl-C again to stop at once)\n"
                       : "\nloom: SIGTERM: saving a checkpoint at the end of this step, then stopping\n");
}

}  // namespace

StopSignals::StopSignals(int rank, int ranks, std::span<const PeerProcess> peers) {
  g_requested = 0;
  g_rank = rank;
  g_data_parallel = ranks > 1;
  g_peer_count = std::min(peers.size(), kMaxPeers);
  std::copy(peers.begin(), peers.begin() + static_cast<std::ptrdiff_t>(g_peer_count), g_peers);
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
