#include "memtrain/train/loop/loss_scaler.h"

#include <torch/torch.h>

#include "memtrain/train/loop/optimizers.h"
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

bool LossScaler::unscale_and_check(const std::vector<at::Tensor>& params) {
  if (!enabled_)
    return true;
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads = gradients_of(params);
  if (grads.empty())
    return true;
  const double inv = 1.0 / scale_;
  if (grads.front().is_cuda()) {
    // One fused pass on the GPU (GradScaler's own kernel): unscale and
    // flag any inf/NaN, with one host sync for the verdict.
    const auto opts = grads.front().options().dtype(torch::kFloat32);
    at::Tensor found_inf = torch::zeros({1}, opts);
    const at::Tensor inv_scale = torch::full({1}, inv, opts);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return found_inf.item<float>() == 0.0f;
  }
  // CPU: LibTorch 1.13 has the fused kernel for CUDA only; these ops run
  // everywhere.
  bool finite = true;
  for (auto& g : grads) {
    if (finite && !torch::isfinite(g).all().item<bool>())
      finite = false;
    g.mul_(inv);
  }
  return finite;
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
