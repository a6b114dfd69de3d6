#pragma once
// A residual 3D U-Net for voxel segmentation (model.name=unet3d), without
// batch-norm (see models.h). `depth` levels, level l with feature_size * 2^l
// channels:
//
//   enc.0 = block(in -> f)                          full resolution
//   enc.l = block(max_pool(2)(x) -> f * 2^l)        l = 1 .. depth-1
//   dec.l = block(cat(up.l(x), skip_l) -> f * 2^l)  l = depth-2 .. 0
//   head  = conv1x1x1(f -> num_classes)
//
// block(a -> b) = relu(norm(conv3(relu(norm(conv3(x))))) + shortcut(x)), the
// shortcut a 1x1x1 projection ("proj") when a != b; up.l a transposed
// conv (kernel 2, stride 2) from level l+1 to level l. Norms ("instance",
// "group", "none") run in fp32 under autocast.
//
// Checkpoint segments (Classifier::segment_names()), largest activations
// first: "dec.0", "enc.0", "dec.1", "enc.1", ..., "enc.<depth-1>" -- a
// level's activations are 4x those of the level below it (8x the voxels,
// half the channels). A decoder segment is its block, run on the
// concatenated tensor; the transposed conv and the concatenation stay
// outside it.
//
// Parameter names: "enc.0.conv1.weight", "enc.0.norm1.weight",
// "enc.0.proj.weight", "up.0.weight", "dec.0.conv2.weight", "head.weight",
// ... Convolutions followed by a norm have no bias.

#include <memory>

#include "memtrain/model/models.h"

namespace memtrain {

// The divisor every spatial size (D, H, W) of a U-Net input must be a
// multiple of: 2^(depth-1).
int64_t unet3d_divisor(int64_t depth);

// Builds the U-Net of `cfg` (depth, norm, feature_size) for `in_channels`
// input channels and `num_classes` output classes. Parameters come from
// LibTorch's default generator (make_model seeds it from cfg.seed).
// forward(x): x (N, in_channels, D, H, W) -> logits (N, num_classes, D, H,
// W); throws memtrain::Error when x has the wrong rank or channel count, or
// when D, H or W is not a multiple of unet3d_divisor(cfg.depth). Throws
// memtrain::Error for a bad cfg (depth < 1, feature_size < 1, unknown
// norm).
std::shared_ptr<Classifier> make_unet3d(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes);

}  // namespace memtrain
