#include "memtrain/memory/oom_guard.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <vector>

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

// Note [A failed backward's leftovers]
// When an error ends a backward that a checkpoint's recomputation entered
// again (a reentrant backward, Note [Checkpointing]), LibTorch's engine
// leaves the failed graph's ready tasks, each with its gradient buffers,
// in this thread's ready queue; they are dropped only when the next
// backward on the thread runs its queue. So an out-of-memory error kept
// that memory through the OOM guard's replay and the planner's next probe:
// measured, the U-Net at 32^3 (feature size 16, depth 3, micro-batch 2,
// 4 of 5 segments checkpointed) held 17,173,504 B more after an OOM in
// backward, until the next step's backward; at 96^3 / feature 48 the
// planner's offload probe ran out at the very start of its forward (6.8
// MiB offloaded) after eleven probes that had, and with the leftovers
// dropped it fitted (3.5 GiB of a 3.8 GB budget). A trivial backward runs
// the queue and drops them (the tasks of a finished graph are skipped);
// `OomGuard.FailedBackwardLeavesNothingHeld` pins it. The training
// window's cleanup and the planner's probes call it: the only backward
// the guard replays. CUDA nodes run on the engine's device thread, whose
// queue a backward of a tensor on that GPU runs: compiled, not run on a
// GPU.
void drop_failed_backward(const c10::Device& device) {
  const torch::AutoGradMode grad(true);
  std::vector<c10::Device> devices = {c10::Device(c10::kCPU)};
  if (!device.is_cpu())
    devices.push_back(device);
  for (const c10::Device& d : devices) {
    const at::Tensor t =
        torch::zeros({1}, torch::TensorOptions().device(d).requires_grad(true));
    (t * 1.0).sum().backward();
  }
}

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
