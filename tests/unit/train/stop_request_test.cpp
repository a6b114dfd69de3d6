#include "memtrain/train/state/stop_request.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace memtrain {
namespace {

// A stop signal must never run its handler on a thread that computes:
// oneDNN's kernels crash when interrupted by one (run_safety.sh's burst).
TEST(StopRequest, SignalsAreTakenOffTheComputingThreads) {
  install_stop_handlers();
  EXPECT_TRUE(stop_signals_blocked_here());
  bool started_after = false;
  std::thread([&] { started_after = stop_signals_blocked_here(); }).join();
  EXPECT_TRUE(started_after) << "a thread started after install_stop_handlers "
                                "must inherit the blocked signals";

  request_stop(0);
  ASSERT_EQ(kill(getpid(), SIGUSR1), 0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (stop_signal() == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(stop_signal(), SIGUSR1) << "the signal thread did not take it";
  request_stop(0);
}

}  // namespace
}  // namespace memtrain
