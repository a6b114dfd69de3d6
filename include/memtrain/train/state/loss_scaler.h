#pragma once
// LossScaler: dynamic loss scaling for fp16 (LibTorch's C++ API has no
// GradScaler; PyTorch issue 44710). The loss is multiplied by scale() before
// backward; after the gradient all-reduce, unscale() divides the gradients
// by it and flags, on the device, whether any is inf or NaN. Because it runs on
// the all-reduced gradients -- identical on every rank, and an inf or NaN on
// any rank is inf or NaN in the sum -- every rank reaches the same verdict
// without another collective. A non-finite step is skipped and the scale
// backs off; after `growth_interval` finite steps in a row it grows.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

class LossScaler {
 public:
  // Disabled: scale() is 1 and unscale() does nothing.
  LossScaler(
      bool enabled,
      double init_scale,
      int64_t growth_interval,
      double growth_factor = 2.0,
      double backoff_factor = 0.5);

  bool enabled() const {
    return enabled_;
  }
  double scale() const {
    return enabled_ ? scale_ : 1.0;
  }

  // Divides every defined gradient by scale() in place (before clipping)
  // and adds 1 to `found` (float32 (1,) on the gradients' device) if any
  // holds an inf or NaN: on the device, read with the window's totals
  // (Note [One host read per window]). Disabled: does nothing.
  void unscale(const std::vector<at::Tensor>& params, const at::Tensor& found);

  // After each window: whether `found` stayed 0.
  void update(bool finite);

  int64_t skipped_steps() const {
    return skipped_;
  }
  int64_t good_steps() const {
    return good_steps_;
  }
  // From a checkpoint.
  void restore(double scale, int64_t good_steps, int64_t skipped) {
    scale_ = scale;
    good_steps_ = good_steps;
    skipped_ = skipped;
  }

 private:
  bool enabled_;
  double scale_;
  int64_t growth_interval_;
  double growth_factor_;
  double backoff_factor_;
  int64_t good_steps_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace memtrain
