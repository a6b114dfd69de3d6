#include "memtrain/train/window_shape.h"

#include <algorithm>

#include "memtrain/config/train_config.h"
#include "memtrain/util/error.h"

namespace memtrain {

WindowShape WindowShape::from_config(const TrainConfig& cfg, int world) {
  WindowShape s;
  s.world = world;
  s.effective_batch = cfg.training.effective_batch_size > 0
                          ? cfg.training.effective_batch_size
                          : world * cfg.training.gradient_accumulation_steps *
                                cfg.data.batch_size;
  s.rank_share = (s.effective_batch + world - 1) / world;
  return s;
}

WindowShape WindowShape::with_micro(int64_t micro) const {
  MT_INTERNAL_ASSERT(micro > 0, "micro-batch ", micro);
  WindowShape s = *this;
  s.micro_batch = std::min(micro, rank_share);
  s.accumulation_steps = (rank_share + s.micro_batch - 1) / s.micro_batch;
  return s;
}

}  // namespace memtrain
