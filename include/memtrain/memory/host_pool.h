#pragma once
// The host pool: where the inputs a checkpointed segment saves wait between
// its forward and its backward when the tier offloads them (Note [Host
// offload] in host_pool.cpp). Blocks are reserved once, within a cap (what
// memory.host_budget leaves after the host plan's other holders, Note
// [Host plan]), and reused by every later micro-step.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain::memory {

struct HostPoolStats {
  int64_t budget = 0;       // the most its blocks may hold (bytes)
  int64_t reserved = 0;     // its blocks, in use or free
  int64_t grows = 0;        // blocks reserved since the pool was made
  int64_t in_use = 0;       // bytes of offloaded tensors now
  int64_t peak_in_use = 0;  // since reset_peak()
  int64_t copied_out = 0;   // bytes offloaded since reset_peak()
  int64_t copied_in = 0;    // bytes restored since reset_peak()
  // Tensors whose device copy was still alive when they were needed back
  // (something else kept them), used without a copy; since the pool was
  // made.
  int64_t still_on_device = 0;
};

// Offloading needed more than memory.host_budget: the message names both
// and what to change.
class HostBudgetExceeded : public Error {
 public:
  using Error::Error;
};

class OffloadGroup;

class HostPool {
 public:
  // Blocks for CUDA tensors are page-locked, so that copies run
  // asynchronously; for CPU tensors they are host-domain memory of the
  // accounting allocator (device_memory.h).
  explicit HostPool(int64_t budget_bytes);  // 0: no budget
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  // Copies `xs` out of device memory into the pool and returns them as one
  // group (a checkpoint's inputs). A tensor that an earlier, still-live
  // group holds (a U-Net skip two segments save) shares that copy. CUDA:
  // the copies run on the pool's copy stream after the work queued so far
  // on the current stream; nothing waits on the host. Throws
  // HostBudgetExceeded when a new block would pass the budget.
  std::shared_ptr<OffloadGroup> offload(const std::vector<at::Tensor>& xs);

  HostPoolStats stats() const;
  void reset_peak();
  // Frees the blocks no offloaded tensor uses (after the planner's probes,
  // whose larger micro-batches reserved more than training needs); returns
  // the bytes freed. CUDA: waits for the copy stream first.
  int64_t trim();

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// One checkpoint's offloaded inputs, in the order given.
class OffloadGroup {
 public:
  struct State;
  explicit OffloadGroup(std::shared_ptr<State> state);
  ~OffloadGroup();
  OffloadGroup(const OffloadGroup&) = delete;
  OffloadGroup& operator=(const OffloadGroup&) = delete;

  // The inputs back in device memory, with their sizes, strides and
  // values, usable on the current stream (CUDA: it waits for their copies
  // through events). They come back now unless they were prefetched. Once:
  // the group lets go of its host copies.
  std::vector<at::Tensor> take();
  // Starts bringing back the closest group offloaded before this one that
  // is still waiting: the next one backward needs (call it when this
  // group's segment is done).
  void prefetch_ahead();

 private:
  std::shared_ptr<State> state_;
};

// The pool that checkpoint(..., Recompute::kAllOffload) uses; null: none.
std::shared_ptr<HostPool> offload_pool();
void set_offload_pool(std::shared_ptr<HostPool> pool);

}  // namespace memtrain::memory
