#pragma once
// Segmentation losses.

#include <ATen/core/Tensor.h>

namespace memtrain {

// Dice + cross-entropy, summed over samples.
//   logits (N, K, D, H, W), any floating dtype (computed in fp32);
//   target (N, D, H, W) int64, values in [0, K) (not checked here: a scan
//   would synchronise a CUDA stream every step; the data layer validates
//   masks).
// Returns a 0-dim float32 tensor on logits' device:
//   sum_n [ CE_n + 1 - (1/K) sum_c Dice_nc ]
// with CE_n the mean over sample n's voxels of the cross-entropy, p =
// softmax over K, g the one-hot target and the soft Dice
//   Dice_nc = (2 sum(p_c g_c) + eps) / (sum(p_c) + sum(g_c) + eps),
//   eps = 1e-5, sums over sample n's voxels.
// Per-sample, never a batch Dice: the loss of a batch is the sum of the
// losses of its parts, which gradient accumulation relies on (the trainer
// divides by the window's sample count). Throws memtrain::Error on shape or
// dtype mismatch.
at::Tensor dice_ce_loss_sum(const at::Tensor& logits, const at::Tensor& target);

constexpr double kDiceEps = 1e-5;

}  // namespace memtrain
