#include "memtrain/infer/sliding_window.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "memtrain/device/placement.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Sliding window memory domains]
// A validation volume can be far larger than anything the training step
// holds: a 512x512x300 CT with 14 classes needs 1.2 GB for the summed
// probabilities alone. So with offload_cpu the whole-volume tensors -- the
// padded volume, the (K, D, H, W) probability sum, the (D, H, W) weight map
// and the output -- live in host memory (memory::HostScope), and so does
// the gathering of each batch of patches. The device holds one batch at a
// time: the patches, the predictor's activations, the logits and the
// weighted probabilities, all released before the next batch is gathered.
// Its peak is therefore set by sw_batch and the roi, never by the volume.
// Without offload_cpu the sum and the weight map are device allocations
// (faster for small volumes on a GPU: no copy back per batch).

namespace {

void check_options(const SlidingWindowOptions& opt, int64_t num_classes) {
  for (int64_t r : opt.roi) {
    MT_CHECK(
        r >= 1,
        "sliding window: roi [",
        opt.roi[0],
        ", ",
        opt.roi[1],
        ", ",
        opt.roi[2],
        "] must be positive (validation.roi)");
  }
  MT_CHECK(
      opt.overlap >= 0.0 && opt.overlap < 1.0,
      "sliding window: overlap=",
      opt.overlap,
      " must be in [0, 1) (validation.overlap)");
  MT_CHECK(
      opt.sw_batch >= 1,
      "sliding window: sw_batch=",
      opt.sw_batch,
      " must be at least 1 (validation.sw_batch)");
  MT_CHECK(
      opt.blend != Blend::kGaussian || opt.sigma_scale > 0.0,
      "sliding window: sigma_scale=",
      opt.sigma_scale,
      " must be positive for gaussian blending");
  MT_CHECK(
      num_classes >= 1,
      "sliding window: num_classes=",
      num_classes,
      " must be at least 1");
}

}  // namespace

std::vector<int64_t> window_starts(int64_t size, int64_t roi, double overlap) {
  MT_INTERNAL_ASSERT(roi >= 1 && size >= roi, "size ", size, " roi ", roi);
  const int64_t step = std::max<int64_t>(
      1, static_cast<int64_t>(std::floor(roi * (1.0 - overlap))));
  std::vector<int64_t> starts;
  for (int64_t s = 0; s + roi < size; s += step)
    starts.push_back(s);
  starts.push_back(size - roi);  // > every start above: no duplicates
  return starts;
}

// Note [The Gaussian window weights]
// MONAI's compute_importance_map(roi, "gaussian", sigma_scale), op for op
// in float32: per axis a of roi r, x = arange(-(r - 1) / 2, (r - 1) / 2 + 1)
// and g_a = exp(x^2 / (-2 sigma^2)) with sigma = sigma_scale * r (a double,
// as Python's); the map is (g_0 outer g_1) outer g_2, NOT scaled to a peak
// of 1 (for an even r the centre lies between voxels: the peak is
// exp(-1/(8 sigma^2)) per axis, 0.977 for a 32^3 roi at 0.125), and
// clamped below at 1e-3 (MONAI: at max(min, 1e-3)), so that every covered
// voxel has some weight. Only the ratios of weights reach the blended
// probabilities, but the floor does not scale with the peak: scaling first
// (memtrain before 2026-11-27) put the floor 2.4% lower relative to the
// peak (issue 34 reports Dice moving by up to 2e-4 from it).
at::Tensor importance_map(const SlidingWindowOptions& opt) {
  const auto& r = opt.roi;
  if (opt.blend == Blend::kConstant)
    return torch::ones({r[0], r[1], r[2]});
  std::array<torch::Tensor, 3> axis;
  for (size_t a = 0; a < 3; ++a) {
    const double sigma = static_cast<double>(r[a]) * opt.sigma_scale;
    const double half = static_cast<double>(r[a] - 1) / 2.0;
    const torch::Tensor x = torch::arange(-half, half + 1, torch::kFloat32);
    axis[a] = torch::exp(x.pow(2) / (-2 * (sigma * sigma)));
  }
  const torch::Tensor map = axis[0].view({-1, 1, 1}) *
                            axis[1].view({1, -1, 1}) * axis[2].view({1, 1, -1});
  return map.clamp_min(1e-3);
}

at::Tensor sliding_window_probs(
    const at::Tensor& volume,
    int64_t num_classes,
    const PatchPredictor& predict,
    const SlidingWindowOptions& opt,
    const Placement& placement) {
  check_options(opt, num_classes);
  MT_CHECK(
      volume.dim() == 4 && volume.scalar_type() == torch::kFloat32 &&
          volume.device().is_cpu(),
      "sliding window: expected a (C, D, H, W) float32 host volume, got ",
      volume.sizes(),
      " ",
      volume.scalar_type(),
      " on ",
      volume.device());
  torch::NoGradGuard no_grad;
  const auto& roi = opt.roi;
  const int64_t channels = volume.size(0);
  const std::array<int64_t, 3> size = {
      volume.size(1), volume.size(2), volume.size(3)};
  std::array<int64_t, 3> padded{};
  for (size_t a = 0; a < 3; ++a)
    padded[a] = std::max(size[a], roi[a]);
  const std::array<int64_t, 3> before = pad_before(size, roi, opt.padding);

  at::Tensor vol = volume;
  if (padded != size) {
    memory::HostScope host;
    vol = torch::constant_pad_nd(
        volume,
        {before[2],
         padded[2] - size[2] - before[2],
         before[1],
         padded[1] - size[1] - before[1],
         before[0],
         padded[0] - size[0] - before[0]});
  }
  struct Window {
    int64_t z, y, x;
  };
  std::vector<Window> windows;
  for (int64_t z : window_starts(padded[0], roi[0], opt.overlap)) {
    for (int64_t y : window_starts(padded[1], roi[1], opt.overlap)) {
      for (int64_t x : window_starts(padded[2], roi[2], opt.overlap))
        windows.push_back({z, y, x});
    }
  }
  const auto patch = [&roi](const at::Tensor& t, const Window& w) {
    const int64_t d = t.dim() - 3;  // t: (..., D, H, W)
    return t.narrow(d, w.z, roi[0])
        .narrow(d + 1, w.y, roi[1])
        .narrow(d + 2, w.x, roi[2]);
  };

  // See Note [Sliding window memory domains].
  at::Tensor imp;  // (rd, rh, rw) window weights, in the buffers' domain
  {
    memory::HostScope host;
    imp = importance_map(opt);
  }
  // weights the device's probs
  const at::Tensor imp_device = placement.to_device(imp);
  at::Tensor sum;     // (K, D, H, W) padded: weighted probability sum
  at::Tensor weight;  // (D, H, W) padded: sum of the weights
  {
    std::optional<memory::HostScope> host;
    std::optional<memory::DeviceScope> device;
    if (opt.offload_cpu) {
      host.emplace();
    } else {
      device.emplace();
      imp = imp_device;
    }
    const auto on = torch::TensorOptions().device(
        opt.offload_cpu ? c10::Device(c10::kCPU) : placement.device());
    sum = torch::zeros({num_classes, padded[0], padded[1], padded[2]}, on);
    weight = torch::zeros({padded[0], padded[1], padded[2]}, on);
  }

  const auto n = static_cast<int64_t>(windows.size());
  // Every device batch has the same size: the last, partial one is filled
  // up with copies of its last window (their outputs are dropped). The
  // peak is not monotonic in the batch size: validating with the U-Net
  // (feature_size 8, roi 16^3, CPU build) peaked at 8.6 MB with
  // validation.sw_batch=1 against 4.3 MB with 4, so a partial last batch
  // made the peak depend on how many windows the volume has.
  const int64_t full = std::min(opt.sw_batch, n);
  for (int64_t b0 = 0; b0 < n; b0 += opt.sw_batch) {
    const int64_t batch = std::min(opt.sw_batch, n - b0);
    at::Tensor probs;  // (B, K, rd, rh, rw), weighted
    {
      at::Tensor gathered;  // (B, C, rd, rh, rw), host
      at::Tensor contexts;  // their context crops, host
      at::Tensor corners;   // (B, 3) int64, host
      {
        memory::HostScope host;
        gathered = torch::empty({full, channels, roi[0], roi[1], roi[2]});
        if (opt.context.on())
          contexts = torch::empty_like(gathered);
        corners = torch::empty({full, 3}, torch::kLong);
        int64_t* corner = corners.data_ptr<int64_t>();
        for (int64_t i = 0; i < full; ++i) {
          const Window& w = windows[b0 + std::min(i, batch - 1)];
          corner[3 * i] = w.z;
          corner[3 * i + 1] = w.y;
          corner[3 * i + 2] = w.x;
          gathered[i].copy_(patch(vol, w));
          if (opt.context.on())
            contexts[i].copy_(
                cut_context(vol, {w.z, w.y, w.x}, roi, opt.context));
        }
      }
      memory::DeviceScope device;
      at::Tensor x = placement.to_device(gathered);
      gathered = at::Tensor();
      at::Tensor c;
      if (contexts.defined())
        c = placement.to_device(contexts);
      contexts = at::Tensor();
      at::Tensor logits = predict(x, c, corners);
      x = at::Tensor();
      c = at::Tensor();
      MT_CHECK(
          logits.dim() == 5 && logits.size(0) == full &&
              logits.size(1) == num_classes && logits.size(2) == roi[0] &&
              logits.size(3) == roi[1] && logits.size(4) == roi[2],
          "sliding window: the model returned logits of shape ",
          logits.sizes(),
          " for ",
          full,
          " patches of ",
          roi[0],
          "x",
          roi[1],
          "x",
          roi[2],
          "; expected (",
          full,
          ", ",
          num_classes,
          ", ",
          roi[0],
          ", ",
          roi[1],
          ", ",
          roi[2],
          ") -- does the model's class count match the data's?");
      probs = torch::softmax(logits, 1, torch::kFloat32);
      logits = at::Tensor();
      probs.mul_(imp_device);
    }
    if (opt.offload_cpu)
      probs = placement.to_host(probs);  // frees the device copy
    for (int64_t i = 0; i < batch; ++i) {
      patch(sum, windows[b0 + i]).add_(probs[i]);
      patch(weight, windows[b0 + i]).add_(imp);
    }
  }
  imp = at::Tensor();

  // Every voxel is covered by a window whose weight is >= 1e-3 there.
  sum.div_(weight);
  weight = at::Tensor();
  at::Tensor out = opt.offload_cpu ? std::move(sum) : placement.to_host(sum);
  sum = at::Tensor();
  if (padded != size) {
    memory::HostScope host;
    out = out.narrow(1, before[0], size[0])
              .narrow(2, before[1], size[1])
              .narrow(3, before[2], size[2])
              .contiguous();
  }
  return out;
}

at::Tensor volume_probs(
    const at::Tensor& volume,
    int64_t num_classes,
    const PatchPredictor& predict,
    const ValidationConfig& cfg,
    const std::array<int64_t, 3>& roi,
    const ContextView& context,
    int64_t* sw_batch,
    int rank,
    const std::string& where,
    int64_t* retries,
    const Placement& placement) {
  OomRetry how;
  how.what = "validation.sw_batch";
  how.where = where;
  how.replay = "the volume";
  how.rank = rank;
  how.give_up = [roi](int64_t, int64_t, int64_t peak) {
    return detail::concat(
        "out of device memory in validation even at validation.sw_batch=1 "
        "(window ",
        roi[0],
        "x",
        roi[1],
        "x",
        roi[2],
        ", measured peak ",
        format_bytes(static_cast<double>(peak)),
        "); use a smaller validation.roi or a larger memory.budget");
  };
  at::Tensor probs;
  *retries += retry_on_oom(how, *sw_batch, [&](int64_t b) {
    SlidingWindowOptions opt;
    opt.roi = roi;
    opt.overlap = cfg.overlap;
    opt.sw_batch = b;
    opt.blend = cfg.blend;
    opt.sigma_scale = cfg.sigma_scale;
    opt.padding = cfg.padding;
    opt.offload_cpu = cfg.offload == Offload::kCpu;
    opt.context = context;
    probs = sliding_window_probs(volume, num_classes, predict, opt, placement);
  });
  return probs;
}

}  // namespace memtrain
