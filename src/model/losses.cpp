#include "memtrain/model/losses.h"

#include <torch/torch.h>

#include <limits>

#include "memtrain/util/error.h"

namespace memtrain {

at::Tensor classification_loss(
    const at::Tensor& logits,
    const at::Tensor& y,
    const ClassificationLoss& how,
    bool per_sample) {
  namespace F = torch::nn::functional;
  if (how.binary) {
    MT_CHECK(
        logits.dim() == 2 && logits.size(1) == 1 && y.dim() == 1 &&
            y.size(0) == logits.size(0),
        "classification_loss: binary logits ",
        logits.sizes(),
        " and labels ",
        y.sizes(),
        " do not match; expected (n, 1) and (n)");
    at::Tensor target = y.to(logits.scalar_type());
    if (how.label_smoothing > 0.0)
      target = target * (1.0 - how.label_smoothing) + how.label_smoothing / 2.0;
    auto opts = F::BinaryCrossEntropyWithLogitsFuncOptions();
    if (per_sample) {
      opts.reduction(torch::kNone);
    } else {
      opts.reduction(torch::kSum);
    }
    return F::binary_cross_entropy_with_logits(logits.squeeze(1), target, opts);
  }
  auto opts = F::CrossEntropyFuncOptions().label_smoothing(how.label_smoothing);
  if (per_sample) {
    opts.reduction(torch::kNone);
  } else {
    opts.reduction(torch::kSum);
  }
  return F::cross_entropy(logits, y, opts);
}

at::Tensor predicted_class(const at::Tensor& logits, bool binary) {
  return binary ? logits.squeeze(1).gt(0).to(torch::kInt64) : logits.argmax(1);
}

at::Tensor dice_ce_loss_sum(
    const at::Tensor& logits, const at::Tensor& target) {
  MT_CHECK(
      logits.dim() == 5 && target.dim() == 4 &&
          logits.size(0) == target.size(0) &&
          logits.sizes().slice(2) == target.sizes().slice(1),
      "dice_ce_loss_sum: logits ",
      logits.sizes(),
      " and target ",
      target.sizes(),
      " do not match; expected (N, K, D, H, W) and (N, D, H, W)");
  MT_CHECK(
      logits.is_floating_point(),
      "dice_ce_loss_sum: logits must be floating point, got ",
      logits.scalar_type());
  MT_CHECK(
      target.scalar_type() == torch::kInt64,
      "dice_ce_loss_sum: target must be int64 class indices, got ",
      target.scalar_type());
  const std::vector<int64_t> voxels = {2, 3, 4};
  const torch::Tensor logp =
      torch::log_softmax(logits.to(torch::kFloat32), /*dim=*/1);
  const torch::Tensor index = target.unsqueeze(1);  // (N, 1, D, H, W)
  // (N): mean cross-entropy of each sample.
  const torch::Tensor ce = -logp.gather(1, index).mean(voxels).squeeze(1);

  const torch::Tensor p = logp.exp();  // softmax
  const torch::Tensor g = torch::zeros_like(p).scatter_(1, index, 1.0);
  const torch::Tensor inter = (p * g).sum(voxels);  // (N, K)
  const torch::Tensor dice =
      (2.0 * inter + kDiceEps) / (p.sum(voxels) + g.sum(voxels) + kDiceEps);
  return (ce + (1.0 - dice.mean(1))).sum();
}

at::Tensor contrastive_losses(
    const at::Tensor& emb,
    const at::Tensor& logit_scale,
    const at::Tensor& ids) {
  MT_CHECK(
      emb.dim() == 3 && emb.size(1) == 2 && ids.dim() == 1 &&
          ids.size(0) == emb.size(0),
      "contrastive_losses: embeddings ",
      emb.sizes(),
      " and ids ",
      ids.sizes(),
      " do not match; expected (n, 2, d) and (n)");
  const int64_t n = emb.size(0);
  const torch::Tensor a = emb.select(1, 0), b = emb.select(1, 1);
  torch::Tensor logits = logit_scale.exp() * a.mm(b.t());  // (n, n)
  const torch::Tensor same = ids.unsqueeze(1).eq(ids.unsqueeze(0));
  const torch::Tensor eye = torch::eye(
      n, torch::TensorOptions().dtype(torch::kBool).device(emb.device()));
  logits = logits.masked_fill(
      same.logical_and(eye.logical_not()),
      -std::numeric_limits<float>::infinity());
  const torch::Tensor a_to_b = -torch::log_softmax(logits, 1).diagonal();
  const torch::Tensor b_to_a = -torch::log_softmax(logits, 0).diagonal();
  return (a_to_b + b_to_a) * 0.5;
}

}  // namespace memtrain
