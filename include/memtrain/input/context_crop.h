#pragma once
// model.context: the larger crop around each volume patch whose features
// give the patch's slices their context (model.name=dinov3; Note [Context
// crops] in context_crop.cpp). One geometry, one resize, for both of its
// readers: training's PatchSource reads the crop's box from the HDF5 file
// (H5Dataset::read_patch: the hyperslab grows, the volume is not copied);
// the sliding window (validation, `memtrain predict`) cuts it from the case
// it holds. Outside the volume both are 0, as the sliding window pads.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstdint>

#include "memtrain/config/train_config.h"

namespace memtrain {

struct ContextView {
  double scale = 0.0;  // 0: no context crop
  int64_t axis = 0;    // the slice axis (0 D, 1 H, 2 W): not widened
  bool on() const {
    return scale > 0.0;
  }
};

// model.context.scale across model.slice_axis.
ContextView context_view(const ModelConfig& model);

struct Box {
  std::array<int64_t, 3> corner{0, 0, 0};  // may lie outside the volume
  std::array<int64_t, 3> size{0, 0, 0};
};

// The context box of the patch at `corner` of `size`: on the two axes
// other than view.axis round(scale x side), plus one where that leaves an
// odd margin, so that both boxes have the same centre exactly; on
// view.axis the patch's own extent.
Box context_box(
    const std::array<int64_t, 3>& corner,
    const std::array<int64_t, 3>& size,
    const ContextView& view);

// A context crop (C, d, h, w) float32, host memory, resized to the patch's
// `size` slice by slice across view.axis: bilinear with antialiasing and
// align_corners false (torch.nn.functional.interpolate's), in the calling
// thread's memory domain. Returns (C, size[0], size[1], size[2]).
at::Tensor resize_context(
    const at::Tensor& crop,
    const std::array<int64_t, 3>& size,
    const ContextView& view);

// The context of the patch at `corner` of `size` of `volume` (C, D, H, W)
// float32, host memory: its context_box cut out (0 outside the volume),
// then resized to `size`.
at::Tensor cut_context(
    const at::Tensor& volume,
    const std::array<int64_t, 3>& corner,
    const std::array<int64_t, 3>& size,
    const ContextView& view);

}  // namespace memtrain
