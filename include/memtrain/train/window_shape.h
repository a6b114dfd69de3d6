#pragma once
// WindowShape: how one accumulation window is cut. The effective batch E
// (samples per optimizer step, all ranks), each rank's largest share of it,
// this rank's micro-batch and the micro-steps that follow. Computed once
// from the config and the plan; the OOM guard changes the micro-batch
// through with_micro(), never by hand.

#include <cstdint>

namespace memtrain {

struct TrainConfig;

struct WindowShape {
  int64_t world = 1;
  int64_t effective_batch = 0;     // E
  int64_t rank_share = 0;          // ceil(E / world)
  int64_t micro_batch = 0;         // this rank's; 0 until planned
  int64_t accumulation_steps = 0;  // ceil(rank_share / micro_batch)

  // E from training.effective_batch_size, else world x
  // gradient_accumulation_steps x data.batch_size (a fixed micro-batch);
  // the micro-batch is set by with_micro() once planned.
  static WindowShape from_config(const TrainConfig& cfg, int world);

  // The same window cut into micro-batches of `micro` (at most the share).
  WindowShape with_micro(int64_t micro) const;

  // True when world x steps x micro-batch passes E: the last micro-batch of
  // a share is smaller.
  bool last_micro_smaller() const {
    return world * accumulation_steps * micro_batch != effective_batch;
  }
};

}  // namespace memtrain
