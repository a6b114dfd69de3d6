#include "memtrain/memory/monitor.h"

#include <algorithm>

#include "memtrain/util/error.h"

namespace memtrain::memory {

std::optional<std::string> LeakDetector::observe(
    int64_t epoch, int64_t held_bytes) {
  std::optional<std::string> warning;
  if (last_ >= 0 && static_cast<double>(held_bytes - last_) > warn_bytes_) {
    if (run_ == 0)
      run_start_bytes_ = last_;
    ++run_;
    if (run_ >= epochs_) {
      const double growth = static_cast<double>(held_bytes - run_start_bytes_);
      warning = detail::concat(
          "possible memory leak: device memory held at the end of an epoch "
          "grew for ",
          run_,
          " epochs in a row, from ",
          format_bytes(static_cast<double>(run_start_bytes_)),
          " to ",
          format_bytes(static_cast<double>(held_bytes)),
          " (+",
          format_bytes(growth),
          ", about ",
          format_bytes(growth / static_cast<double>(run_)),
          " per epoch) at epoch ",
          epoch + 1,
          ". Likely causes: a tensor kept across steps (a loss summed "
          "without .item(), a list of outputs), a growing cache.");
    }
  } else {
    run_ = 0;
  }
  last_ = held_bytes;
  return warning;
}

void Monitor::begin_window() {
  reset_peak();
}

WindowMemory Monitor::end_window() {
  const Stats s = stats();
  WindowMemory w{s.allocated, s.reserved, s.peak_allocated, s.peak_reserved};
  epoch_peak_ = std::max(epoch_peak_, s.peak_allocated);
  return w;
}

void Monitor::note_peak() {
  epoch_peak_ = std::max(epoch_peak_, stats().peak_allocated);
}

}  // namespace memtrain::memory
