#pragma once
// Sliding-window inference over whole volumes with host-side aggregation:
// only patch batches ever sit on the device, so the device peak of a
// validation does not grow with the volume. See Note [Sliding window memory
// domains] in sliding_window.cpp.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"
#include "memtrain/config/train_config.h"
#include "memtrain/data/sampling/case_padding.h"
#include "memtrain/input/context_crop.h"

namespace memtrain {

class Placement;

struct SlidingWindowOptions {
  std::array<int64_t, 3> roi{64, 64, 64};  // window (rd, rh, rw)
  double overlap = 0.25;                   // [0, 1)
  int64_t sw_batch = 4;                    // patches per device batch
  Blend blend = Blend::kGaussian;          // gaussian | constant
  double sigma_scale = 0.125;              // gaussian sigma = sigma_scale * roi
  Padding padding = Padding::kSymmetric;   // a volume smaller than the roi
  bool offload_cpu = true;                 // aggregation buffers in host memory
  ContextView context;  // on: each window's context crop goes with it
};

// Called with a (B, C, rd, rh, rw) float32 tensor of patches that is already
// device memory, with their context crops (the same shape, device memory;
// undefined unless SlidingWindowOptions::context is on) and with their
// corners in the padded volume ((B, 3) int64, host memory: what a feature
// cache keys on); returns logits (B, K, rd, rh, rw) (any floating dtype).
using PatchPredictor = std::function<at::Tensor(
    const at::Tensor& x, const at::Tensor& context, const at::Tensor& corners)>;

// Window starts along one axis of `size` voxels (size >= roi): 0, step,
// 2 step, ... with step = max(1, floor(roi * (1 - overlap))), the last one
// clamped to size - roi so that the axis is covered exactly.
std::vector<int64_t> window_starts(int64_t size, int64_t roi, double overlap);

// (rd, rh, rw) float32 weights of a window's voxels: ones for "constant";
// for "gaussian" MONAI's compute_importance_map (Note [The Gaussian window
// weights]): the product of per-axis gaussians centred on the window with
// sigma = sigma_scale * roi, unscaled, clamped below at 1e-3. Allocated in
// the calling thread's current memory domain.
at::Tensor importance_map(const SlidingWindowOptions& opt);

// volume: (C, D, H, W) float32, host memory. Returns (K, D, H, W) float32,
// host memory: for each voxel the importance-weighted average of the
// softmax probabilities of every window covering it. An axis shorter than
// its roi is zero-padded to the roi (pad_before(opt.padding)) and the
// result cropped back.
// Runs with grad off and blocks until done. Patches are gathered on the host
// sw_batch at a time, moved to `placement`'s device, predicted,
// softmaxed and weighted there, and added into aggregation buffers that live
// in host memory (offload_cpu) or device memory; each batch's device
// tensors are released before the next batch. Throws memtrain::Error for
// bad options, a volume that is not (C, D, H, W) float32, or a predictor
// whose output is not (B, num_classes, rd, rh, rw).
at::Tensor sliding_window_probs(
    const at::Tensor& volume,
    int64_t num_classes,
    const PatchPredictor& predict,
    const SlidingWindowOptions& opt,
    const Placement& placement);

// The whole-volume probabilities (K, D, H, W), host memory, of `volume`
// ((C, D, H, W) float32, host memory) by sliding window on `placement`'s
// device (validation.overlap, blend and offload from `cfg`, windows of
// `roi`, *sw_batch at a time, each with its `context` crop when on). On running
// out of device memory it halves *sw_batch and runs the volume again, adding to
// *retries; `where` names the volume in messages. Validation and `memtrain
// predict` use it.
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
    const Placement& placement);

}  // namespace memtrain
