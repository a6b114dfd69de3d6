#pragma once
// Monitor: device memory per window and per epoch, and the leak warning.

#include <cstdint>
#include <optional>
#include <string>

#include "memtrain/memory/device_memory.h"

namespace memtrain::memory {

struct WindowMemory {
  int64_t allocated = 0;  // held at the end of the window
  int64_t reserved = 0;
  int64_t peak = 0;  // peak allocated during the window
  int64_t peak_reserved = 0;
};

// Leak warning: the bytes held at the same point of successive epochs (the
// end of the last window, before validation) grew by more than `warn_bytes`
// for `epochs` epochs in a row. Growth that then stops resets the count.
class LeakDetector {
 public:
  LeakDetector(double warn_bytes, int64_t epochs)
      : warn_bytes_(warn_bytes), epochs_(epochs) {}

  // Returns the warning text when the condition is met at this epoch.
  std::optional<std::string> observe(int64_t epoch, int64_t held_bytes);

 private:
  double warn_bytes_;
  int64_t epochs_;
  int64_t last_ = -1;
  int64_t run_ = 0;  // epochs in a row with growth above the threshold
  int64_t run_start_bytes_ = 0;
};

class Monitor {
 public:
  // Starts a window: the window peak restarts from the current bytes.
  void begin_window();
  WindowMemory end_window();
  // The epoch's peak (the max of its windows' and validation's peaks).
  int64_t epoch_peak() const {
    return epoch_peak_;
  }
  void begin_epoch() {
    epoch_peak_ = 0;
  }
  // Folds the current peak into the epoch peak (after validation, say).
  void note_peak();

 private:
  int64_t epoch_peak_ = 0;
};

}  // namespace memtrain::memory
