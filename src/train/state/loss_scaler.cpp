#include "memtrain/train/state/loss_scaler.h"

#include <torch/torch.h>

#include "memtrain/device/host_sync.h"
#include "memtrain/train/state/optimizers.h"
#include "memtrain/util/error.h"

namespace memtrain {

LossScaler::LossScaler(
    bool enabled,
    double init_scale,
    int64_t growth_interval,
    double growth_factor,
    double backoff_factor)
    : enabled_(enabled),
      scale_(init_scale),
      growth_interval_(growth_interval),
      growth_factor_(growth_factor),
      backoff_factor_(backoff_factor) {
  MT_INTERNAL_ASSERT(
      init_scale > 0 && growth_interval > 0 && growth_factor > 1 &&
      backoff_factor > 0 && backoff_factor < 1);
}

void LossScaler::unscale(
    const std::vector<at::Tensor>& params, const at::Tensor& found) {
  if (!enabled_)
    return;
  // GradScaler's own fused kernel on CUDA (one pass: unscale and flag).
  flag_nonfinite(gradients_of(params), 1.0 / scale_, found);
}

void LossScaler::update(bool finite) {
  if (!enabled_)
    return;
  if (!finite) {
    scale_ *= backoff_factor_;
    good_steps_ = 0;
    ++skipped_;
    return;
  }
  if (++good_steps_ >= growth_interval_) {
    scale_ *= growth_factor_;
    good_steps_ = 0;
  }
}

}  // namespace memtrain
