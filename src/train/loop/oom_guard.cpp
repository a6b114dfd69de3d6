#include "memtrain/train/loop/oom_guard.h"

#include <c10/util/Exception.h>

#include <algorithm>

#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {

// Note [OOM recovery]
// An out-of-memory error in a micro-step unwinds it (its graph and tensors
// are freed as the exception passes). The guard then drops the gradients
// accumulated so far in the window, releases cached blocks, halves this
// rank's micro-batch and replays the window from its first micro-step. Only
// this rank changes its split; no collective has happened yet in the window,
// so the others simply wait at the boundary. By Note [Window weighting] the
// update is the one the smaller micro-batch would have given from the start.
// The smaller micro-batch stays for the rest of the run. The boundary itself
// (all-reduce, optimizer step) is not replayed: its memory was measured by
// the planner's probes. Validation halves its batch (rows) or its windows
// per batch (volumes) through the same loop and redoes the batch or volume.

int64_t retry_on_oom(
    const OomRetry& how,
    int64_t& size,
    const std::function<void(int64_t)>& attempt) {
  for (int64_t retries = 0;; ++retries) {
    try {
      attempt(size);
      return retries;
    } catch (const c10::OutOfMemoryError&) {
      if (how.cleanup)
        how.cleanup();
      memory::release_cache();
      const bool limited = how.max_retries >= 0;
      if (size <= 1 || (limited && retries + 1 > how.max_retries)) {
        const int64_t peak = memory::stats().peak_reserved;
        std::string snapshot;
        if (!how.snapshot_dir.empty())
          snapshot = memory::write_snapshot(how.snapshot_dir);
        throw Error(
            how.give_up(size, retries, peak) +
            (snapshot.empty() ? ""
                              : " (allocator snapshot: " + snapshot + ")"));
      }
      const int64_t in_use =
          how.in_use_cap > 0 ? std::min(size, how.in_use_cap) : size;
      const int64_t smaller = std::max<int64_t>(1, in_use / 2);
      log_event(
          detail::concat(
              "[rank ",
              how.rank,
              "] out of device memory at ",
              how.what,
              " ",
              size,
              " (",
              how.where,
              "); replaying ",
              how.replay,
              " at ",
              how.what,
              " ",
              smaller),
          /*echo=*/true);
      size = smaller;
    }
  }
}

}  // namespace memtrain
