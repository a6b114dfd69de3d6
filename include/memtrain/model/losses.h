#pragma once
// Classification, segmentation and contrastive losses.

#include <ATen/core/Tensor.h>

namespace memtrain {

// How rows are classified: a softmax over K >= 2 logits, or one logit per
// row (binary: model.num_classes 1, labels 0 and 1).
struct ClassificationLoss {
  bool binary = false;
  double label_smoothing = 0.0;  // training.label_smoothing, in [0, 1)
};

// The loss of a classifier of rows, summed over the batch (0-dim), or per
// sample (n,) with `per_sample`; float32 on logits' device.
//   K-way: logits (n, K), y (n,) int64 in [0, K): cross-entropy with
//   LibTorch's label_smoothing s (target (1 - s) one-hot + s / K).
//   binary: logits (n, 1), y (n,) int64 in {0, 1}: binary cross-entropy of
//   sigmoid(logit) against t = y (1 - s) + s / 2 (timm's
//   BinaryCrossEntropy smoothing).
// The one definition of the loss the row tasks' training and validation
// (train/tasks/row_task.cpp, volume_rows.cpp) compute.
at::Tensor classification_loss(
    const at::Tensor& logits,
    const at::Tensor& y,
    const ClassificationLoss& how,
    bool per_sample = false);

// The predicted class of each row, (n,) int64: the argmax, or for binary
// logits (n, 1) whether the logit is > 0 (sigmoid > 1/2).
at::Tensor predicted_class(const at::Tensor& logits, bool binary);

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

// The symmetric InfoNCE of CLIP, per sample.
//   emb (n, 2, d) float32: row i's embeddings of a and b, unit L2 norm
//   (DualEncoder::forward); logit_scale t, 0-dim; ids (n,) int64 pair ids.
// With logits L_ij = exp(t) <a_i, b_j>,
//   l_i = ( -log softmax_j(L_i.)_i  -log softmax_j(L_.i)_i ) / 2,
// where an entry j != i with ids_j == ids_i (the same pair, e.g. a second
// caption of one image) is left out of both softmaxes. Returns l (n,)
// float32; its mean is CLIP's loss of that batch of n pairs. Every sample's
// loss depends on the whole batch: Note [Exact contrastive accumulation].
at::Tensor contrastive_losses(
    const at::Tensor& emb,
    const at::Tensor& logit_scale,
    const at::Tensor& ids);

}  // namespace memtrain
