#pragma once
// WindowShape: how one accumulation window is cut. The effective batch E
// (samples per optimizer step, all ranks), each rank's largest share of it,
// this rank's micro-batch and the micro-steps that follow. Computed once
// from the config (TrainConfig::effective_batch) and the plan; the OOM
// guard changes the micro-batch through with_micro(), never by hand. The
// two formulas below are the only ones: the memory planner, the sampler's
// even split (model.sync_bn) and WindowShape use them.

#include <cstdint>
#include <utility>

namespace memtrain {

// Rank `rank`'s contiguous slice [first, second) of `n` items split over
// `world` ranks: [n * rank / world, n * (rank + 1) / world). A window's
// samples (ShardedSampler::plan) and data.val's rows are split so.
std::pair<int64_t, int64_t> rank_slice(int64_t n, int64_t rank, int64_t world);

// The largest rank's share of a window of `samples` over `world` ranks,
// ceil(samples / world): the longest rank_slice.
int64_t largest_share(int64_t samples, int64_t world);

// The micro-steps of a share of `share` samples at micro-batch `micro`:
// ceil(share / micro).
int64_t steps_for_share(int64_t share, int64_t micro);

// The micro-steps of the largest rank share of a window of `samples`:
// steps_for_share(largest_share(samples, world), micro). A window shorter
// than E (an epoch's last) may need fewer than accumulation_steps.
int64_t micro_steps_for(int64_t samples, int64_t world, int64_t micro);

struct WindowShape {
  int64_t world = 1;
  int64_t effective_batch = 0;     // E
  int64_t rank_share = 0;          // largest_share(E, world)
  int64_t micro_batch = 0;         // this rank's; 0 until planned
  int64_t accumulation_steps = 0;  // steps_for_share(rank_share, micro)

  // A window of `effective_batch` samples over `world` ranks (the config's:
  // TrainConfig::effective_batch); the micro-batch is set by with_micro()
  // once planned.
  static WindowShape for_batch(int64_t effective_batch, int world);

  // The same window cut into micro-batches of `micro` (at most the share).
  WindowShape with_micro(int64_t micro) const;

  // True when world x steps x micro-batch passes E: the last micro-batch of
  // a share is smaller.
  bool last_micro_smaller() const {
    return world * accumulation_steps * micro_batch != effective_batch;
  }
};

}  // namespace memtrain
