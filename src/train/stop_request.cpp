#include "memtrain/train/stop_request.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace memtrain {
namespace {

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

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGUSR1, SIGINT})
    sigaction(sig, &sa, nullptr);
}

int stop_signal() {
  return g_signal.load();
}

void request_stop(int signal) {
  g_signal.store(signal);
}

}  // namespace memtrain
