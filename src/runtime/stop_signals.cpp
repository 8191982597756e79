// Stop signals for the trainer (include/multinorm/stop_signals.h). The handler sets a sig_atomic_t
// and writes one line; on a second SIGINT it restores the previous action and raises the signal
// again; a later SIGTERM or SIGUSR1 changes nothing: async-signal-safe.
#include "multinorm/stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include "multinorm/comm.h"

namespace multinorm {

namespace {
constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
volatile sig_atomic_t g_received = 0;
struct sigaction g_previous[3];

// "multinorm: rank 1 of 2: SIGTERM received during update 12: stopping after it ...", assembled
// without allocation (the handler may interrupt malloc).
void say_received(int sig) {
  char line[400];
  size_t n = 0;
  auto add = [&](const char* text) {
    while (*text && n + 1 < sizeof(line)) line[n++] = *text++;
  };
  add("multinorm: ");
  if (*Comm::rank_text_for_handler()) add("rank "), add(Comm::rank_text_for_handler()), add(": ");
  add(StopSignals::name(sig));
  add(" received during "), add(Comm::activity_for_handler());
  add(": stopping after the update in flight, with a checkpoint (a second SIGINT ends at once)\n");
  const ssize_t w = ::write(STDERR_FILENO, line, n);
  (void)w;
}

// A job scheduler may send the same stop twice by two ways (SLURM signals every process of a job,
// and mpirun forwards it again): only a second SIGINT, a person's Ctrl-C twice, ends the process at
// once; the scheduler's SIGKILL after its grace period is its hard stop.
void on_stop(int sig) {
  if (g_received == 0) {
    g_received = sig;
    say_received(sig);
    return;
  }
  if (sig != SIGINT) return;
  ::sigaction(SIGINT, &g_previous[1], nullptr);  // what Ctrl-C would have done without us
  ::raise(SIGINT);
}
}  // namespace

StopSignals::StopSignals() {
  g_received = 0;
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  ::sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &sa, &g_previous[i]);
}

StopSignals::~StopSignals() {
  for (int i = 0; i < 3; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
}

int StopSignals::received() { return g_received; }

const char* StopSignals::name(int signal) {
  switch (signal) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

}  // namespace multinorm
