#pragma once
// Progress: the human progress line on rank 0. On a terminal it redraws one
// line in place; into a file or pipe (a batch job's log) it prints a full
// line at most every `every_s` seconds, so logs stay short.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace memtrain {

class Progress {
 public:
  Progress(std::FILE* out, bool is_tty, double every_s);

  // After each window. `done`/`total`: windows of the whole run.
  void window(
      int64_t epoch,
      int64_t epochs,
      int64_t window,
      int64_t windows_per_epoch,
      double loss,
      double samples_per_s,
      int64_t done,
      int64_t total);

  // A line that must always appear (epoch summaries, the launch banner).
  void line(const std::string& text);

 private:
  std::FILE* out_;
  bool tty_;
  double every_s_;
  bool pending_redraw_ = false;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  bool printed_any_ = false;
};

// "1:02:03" / "2:03".
std::string format_duration(double seconds);

}  // namespace memtrain
