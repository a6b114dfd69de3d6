#pragma once
// Small shared helpers for timing and naming where a message comes from.

#include <chrono>
#include <string>

namespace memtrain {

using Clock = std::chrono::steady_clock;

// Seconds elapsed since `start` (steady clock).
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// This machine's host name, for messages ("" if it cannot be read).
std::string host_name();

}  // namespace memtrain
