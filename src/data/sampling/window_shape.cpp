#include "memtrain/data/sampling/window_shape.h"

#include <algorithm>

#include "memtrain/util/error.h"

namespace memtrain {

std::pair<int64_t, int64_t> rank_slice(int64_t n, int64_t rank, int64_t world) {
  MT_INTERNAL_ASSERT(n >= 0 && world > 0 && rank >= 0 && rank < world);
  return {n * rank / world, n * (rank + 1) / world};
}

int64_t largest_share(int64_t samples, int64_t world) {
  MT_INTERNAL_ASSERT(samples >= 0 && world > 0);
  return (samples + world - 1) / world;
}

int64_t steps_for_share(int64_t share, int64_t micro) {
  MT_INTERNAL_ASSERT(share >= 0 && micro > 0);
  return (share + micro - 1) / micro;
}

int64_t micro_steps_for(int64_t samples, int64_t world, int64_t micro) {
  return steps_for_share(largest_share(samples, world), micro);
}

WindowShape WindowShape::for_batch(int64_t effective_batch, int world) {
  MT_INTERNAL_ASSERT(world > 0 && effective_batch >= 0);
  WindowShape s;
  s.world = world;
  s.effective_batch = effective_batch;
  s.rank_share = largest_share(effective_batch, world);
  return s;
}

WindowShape WindowShape::with_micro(int64_t micro) const {
  MT_INTERNAL_ASSERT(micro > 0, "micro-batch ", micro);
  WindowShape s = *this;
  s.micro_batch = std::min(micro, rank_share);
  s.accumulation_steps = steps_for_share(rank_share, s.micro_batch);
  return s;
}

}  // namespace memtrain
