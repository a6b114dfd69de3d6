#include "memtrain/input/context_crop.h"

#include <torch/nn/functional/upsampling.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include "memtrain/util/error.h"

namespace memtrain {

// Note [Context crops]
// ~~~~~~~~~~~~~~~~~~~~
// The seed's users run their frozen DINOv3 twice per patch: on the patch's
// slices and on a crop `scale` times wider around the same centre, resized
// to the patch's sides, so the head sees each voxel's surroundings at a
// coarser scale. Here:
// - The box widens only the two sides of each slice; its slices are the
//   patch's. Its side is round(scale x side) plus one where the margin
//   would be odd, so its corner is the patch's minus a whole margin and
//   both centres are the same point: a voxel of the patch and the same
//   voxel of the context, after the resize, line up.
// - Outside the volume the crop is 0 (the z-scored mean), as the sliding
//   window pads a case smaller than its window and as read_patch pads a
//   patch that leaves its case: training and validation see the same
//   context for the same box (a unit test holds them equal).
// - The resize is bilinear with antialiasing (a wider crop shrunk without
//   it would alias the finest structures), align_corners false: torch's
//   F.interpolate(mode="bilinear", antialias=True), and torchvision's
//   Resize on tensors. Done on the host, on the reader thread in training,
//   so the device receives a context no larger than the patch.
// - Training flips the resized context with its patch (data.flip): a crop
//   centred on the patch mirrored about that centre is the mirrored
//   volume's crop.

ContextView context_view(const ModelConfig& model) {
  return ContextView{model.context.scale, model.slice_axis};
}

Box context_box(
    const std::array<int64_t, 3>& corner,
    const std::array<int64_t, 3>& size,
    const ContextView& view) {
  MT_INTERNAL_ASSERT(view.on() && view.scale > 1.0, "context scale <= 1");
  Box b{corner, size};
  for (int64_t a = 0; a < 3; ++a) {
    if (a == view.axis)
      continue;
    int64_t side = std::llround(view.scale * static_cast<double>(size[a]));
    if ((side - size[a]) % 2 != 0)
      ++side;
    side = std::max(side, size[a] + 2);
    b.size[a] = side;
    b.corner[a] = corner[a] - (side - size[a]) / 2;
  }
  return b;
}

at::Tensor resize_context(
    const at::Tensor& crop,
    const std::array<int64_t, 3>& size,
    const ContextView& view) {
  MT_INTERNAL_ASSERT(crop.dim() == 4, "context crop not (C, d, h, w)");
  const int64_t axis = 1 + view.axis;
  MT_INTERNAL_ASSERT(crop.size(axis) == size[view.axis], "context slices");
  std::vector<int64_t> plane;  // the slice's two sides, in order
  for (int64_t a = 0; a < 3; ++a) {
    if (a != view.axis)
      plane.push_back(size[a]);
  }
  // (C, ...) -> (S, C, A, B): slices as the batch.
  const at::Tensor slices = crop.movedim(axis, 0);
  namespace F = torch::nn::functional;
  const at::Tensor resized = F::interpolate(
      slices,
      F::InterpolateFuncOptions()
          .size(plane)
          .mode(torch::kBilinear)
          .align_corners(false)
          .antialias(true));
  return resized.movedim(0, axis).contiguous();
}

at::Tensor cut_context(
    const at::Tensor& volume,
    const std::array<int64_t, 3>& corner,
    const std::array<int64_t, 3>& size,
    const ContextView& view) {
  MT_INTERNAL_ASSERT(volume.dim() == 4, "volume not (C, D, H, W)");
  const Box b = context_box(corner, size, view);
  // The part inside the volume, then 0 around it.
  at::Tensor part = volume;
  std::vector<int64_t> pad(6, 0);  // constant_pad_nd: last axis first
  for (int64_t a = 0; a < 3; ++a) {
    const int64_t extent = volume.size(1 + a);
    const int64_t lo = std::max<int64_t>(b.corner[a], 0);
    const int64_t hi = std::min(b.corner[a] + b.size[a], extent);
    MT_INTERNAL_ASSERT(lo < hi, "context box outside the volume");
    part = part.narrow(1 + a, lo, hi - lo);
    pad[2 * (2 - a)] = lo - b.corner[a];
    pad[2 * (2 - a) + 1] = b.corner[a] + b.size[a] - hi;
  }
  return resize_context(torch::constant_pad_nd(part, pad), size, view);
}

}  // namespace memtrain
