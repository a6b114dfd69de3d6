#include "memtrain/train/state/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace memtrain {

double lr_at(const TrainingConfig& t, int64_t step, int64_t total) {
  const int64_t warmup = t.warmup_windows;
  if (step < warmup)
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (t.lr_schedule == LrSchedule::kConstant)
    return t.lr;
  const int64_t span = std::max<int64_t>(1, total - warmup);
  const double x = std::min(
      1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  const double factor = t.lr_schedule == LrSchedule::kCosine
                            ? 0.5 * (1.0 + std::cos(M_PI * x))
                            : std::pow(1.0 - x, t.poly_power);
  return t.min_lr + (t.lr - t.min_lr) * factor;
}

}  // namespace memtrain
