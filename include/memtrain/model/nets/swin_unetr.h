#pragma once
// MONAI's SwinUNETR (model.name=swin_unetr), 3D, as
// monai.networks.nets.SwinUNETR(in_channels, out_channels, feature_size)
// builds it with its defaults (MONAI 1.6.1): patch size 2, depths
// (2, 2, 2, 2), heads (3, 6, 12, 24), window 7, MLP ratio 4, qkv bias,
// PatchMerging ("merging"), no patch norm, normalized hidden states,
// instance norm (no affine) in the convolution blocks, not use_v2 (say so:
// MONAI's v2 adds a residual convolution block before each stage; not
// built here). Tensor names, shapes and state-dict order are MONAI's
// ("swinViT.layers1.0.blocks.0.attn.qkv.weight", ...), so a MONAI state
// dict loads by name (Note [SwinUNETR as MONAI] in swin_unetr.cpp).
//
// Checkpoint segments, largest activations first (Note [SwinUNETR's
// segments] in swin_unetr.cpp): "layers1.0.blocks.0", "layers1.0.blocks.1",
// "decoder1", "encoder1", "decoder2", "encoder2", the blocks of layers2,
// "decoder3", "encoder3", the blocks of layers3, "decoder4", "encoder4",
// the blocks of layers4, "decoder5", "encoder10": each Swin block (the
// last of a stage with its patch merging), each decoder block (the
// transposed convolution, the concatenation, the residual block) and each
// encoder block.

#include <array>
#include <cstdint>
#include <memory>

#include "memtrain/model/models.h"

namespace memtrain {

// Every spatial size of a SwinUNETR input is a multiple of this: 2^5.
constexpr int64_t kSwinUnetrDivisor = 32;

// Throws memtrain::Error for a feature size that is not a multiple of 12
// (MONAI's rule: the stages' widths divide among 3, 6, 12, 24 heads).
std::shared_ptr<Classifier> make_swin_unetr(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes);

namespace detail {

// The shifted blocks' attention mask, (windows, n, n): 0 between tokens of
// one region, -100 across, for a feature map padded to `padded` with
// `window` and `shift` per axis, made on `device` (no host copy). Exposed
// for the tests, which hold it against MONAI's host-side construction.
torch::Tensor swin_shift_mask(
    const std::array<int64_t, 3>& padded,
    const std::array<int64_t, 3>& window,
    const std::array<int64_t, 3>& shift,
    const c10::Device& device);

}  // namespace detail

}  // namespace memtrain
