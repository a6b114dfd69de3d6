#pragma once
// The OOM guard: the one halve-and-replay loop. Training windows, row
// validation and sliding-window validation all run their work through it.
// See Note [OOM recovery] in oom_guard.cpp.

#include <cstdint>
#include <functional>
#include <string>

namespace c10 {
struct Device;
}

namespace memtrain {

struct OomRetry {
  std::string what;    // the size that halves: "micro-batch", ...
  std::string where;   // for the log line: "epoch 2, window 5"
  std::string replay;  // what is redone: "the window", "the volume"
  int rank = 0;
  int64_t max_retries = -1;  // -1: until the size is 1
  // > 0: a size above this is treated as this before halving (a micro-batch
  // larger than the rank's share of a window is the share).
  int64_t in_use_cap = 0;
  // Where the allocator snapshot goes when the guard gives up ("": none).
  std::string snapshot_dir;
  // After an out-of-memory error, before the cache is released (drop the
  // window's gradients, say). May be empty.
  std::function<void()> cleanup;
  // The error text when the guard gives up at `size` after `retries`
  // retries, with the peak device bytes measured; the guard appends the
  // allocator snapshot's path when it wrote one.
  std::function<std::string(int64_t size, int64_t retries, int64_t peak)>
      give_up;
};

// Calls attempt(size) until it returns without c10::OutOfMemoryError. After
// each one: cleanup(), release of cached device memory, size halved, one
// log line (echoed to stderr) naming the rank, the sizes and `where`, and
// attempt again. Throws memtrain::Error(give_up(...)) when the size is
// already 1 or more than max_retries retries were needed; on a CUDA device
// the allocator's snapshot is written first. Returns the retries taken; on
// return `size` is the size that worked. Local: no collective.
int64_t retry_on_oom(
    const OomRetry& how,
    int64_t& size,
    const std::function<void(int64_t size)>& attempt);

// After an exception out of a backward (an out-of-memory error): lets go
// of what LibTorch's autograd engine still holds of the failed backward
// on this thread and, for a GPU `device`, on its device thread (Note [A
// failed backward's leftovers] in oom_guard.cpp). For whatever catches an
// out-of-memory error from a backward and goes on: the training window's
// OomRetry::cleanup, the planner's probes.
void drop_failed_backward(const c10::Device& device);

}  // namespace memtrain
