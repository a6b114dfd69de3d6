#pragma once
// Stop requests from signals. SIGTERM and SIGUSR1 (SLURM's --signal) and a
// first SIGINT ask the run to stop at the next accumulation boundary: every
// rank finishes its window, the ranks agree (the request rides in the
// gradient all-reduce), rank 0 writes a checkpoint, and the process exits
// with kExitStopped. A second SIGINT exits at once.

namespace memtrain {

// Installs the handlers (async-signal-safe: they only set a flag) and
// routes the signals to one thread of their own: call it before any thread
// that computes is started. The calling thread, and every thread it starts
// afterwards, blocks SIGTERM, SIGUSR1 and SIGINT.
void install_stop_handlers();

// Whether the calling thread blocks all three stop signals.
bool stop_signals_blocked_here();

// 0 if no stop was requested, else the signal number.
int stop_signal();

// For tests: as if `signal` had arrived.
void request_stop(int signal);

}  // namespace memtrain
