#include "memtrain/train/state/stop_request.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <thread>

namespace memtrain {
namespace {

constexpr int kStopSignals[] = {SIGTERM, SIGUSR1, SIGINT};

std::atomic<int> g_signal{0};
std::atomic<int> g_interrupts{0};

extern "C" void on_signal(int sig) {
  if (sig == SIGINT && g_interrupts.fetch_add(1) >= 1) {
    constexpr char kMsg[] = "memtrain: second interrupt: exiting now\n";
    (void)!write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(128 + SIGINT);
  }
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);
}

sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kStopSignals)
    sigaddset(&set, sig);
  return set;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : kStopSignals)
    sigaction(sig, &sa, nullptr);
  // The handler runs on one thread of its own, never on a thread that
  // computes: oneDNN's CPU kernels crash (SIGSEGV, SIGABRT) when a handler
  // interrupts them, as SLURM's --signal or a user's kill does at any
  // moment. The calling thread blocks the signals, and every thread it starts
  // from now on (OpenMP's, the readers', autograd's, CUDA's and NCCL's)
  // inherits the mask; the thread below unblocks them and sleeps.
  const sigset_t set = stop_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set] {
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    for (;;)
      pause();
  }).detach();
}

bool stop_signals_blocked_here() {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  for (int sig : kStopSignals) {
    if (sigismember(&now, sig) != 1)
      return false;
  }
  return true;
}

int stop_signal() {
  return g_signal.load();
}

void request_stop(int signal) {
  g_signal.store(signal);
}

}  // namespace memtrain
