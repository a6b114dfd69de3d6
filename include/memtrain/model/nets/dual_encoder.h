#pragma once
// DualEncoder (model.name: dual_encoder): two towers for pair files
// (docs/data-format.md, Pairs). Tower a is make_model's mlp (on /features_a) or
// cnn (on /images), tower b the mlp on /features_b, each with
// model.embed_dim outputs, L2-normalised. A learnable logit scale
// t = log(1 / model.init_temperature) multiplies the cosine similarities
// by exp(t); after each optimizer step t is clamped to [0, log 100], as
// CLIP does. The loss (contrastive_losses in model/losses.h) is the
// symmetric InfoNCE. Parameter names: "tower_a.<mlp's or cnn's>",
// "tower_b.<mlp's>", "logit_scale".
#include <torch/torch.h>

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

// A model of pairs trained with the symmetric InfoNCE (train/tasks/
// pair_task.cpp): DualEncoder, ClipModel (model/clip.h).
class PairEncoder : public Classifier {
 public:
  using Classifier::forward;
  // (n, 2, embed_dim()): [i][0] = tower a's embedding of row i, [i][1] =
  // tower b's, each of unit L2 norm (computed in float32).
  torch::Tensor forward(torch::Tensor a, torch::Tensor b) override = 0;
  virtual int64_t embed_dim() const = 0;
  // The learnable logit scale t (0-dim; the logits are exp(t) cos).
  const torch::Tensor& logit_scale() const {
    return logit_scale_;
  }
  // CLIP's clamp of the logit scale to [0, log 100], after each step.
  void clamp_logit_scale();

 protected:
  // L2-normalised rows of z, in float32 (F.normalize's eps 1e-12).
  static torch::Tensor unit(const torch::Tensor& z);
  // Registers "logit_scale" = log(1 / init_temperature), where the model's
  // parameter order puts it.
  void register_logit_scale(double init_temperature);

 private:
  torch::Tensor logit_scale_;
};

class DualEncoder : public PairEncoder {
 public:
  DualEncoder(
      std::shared_ptr<Classifier> a,
      std::shared_ptr<Classifier> b,
      double init_temperature,
      int64_t embed_dim);
  using Classifier::forward;
  torch::Tensor forward(torch::Tensor a, torch::Tensor b) override;
  int64_t embed_dim() const override {
    return embed_dim_;
  }
  // Tower a's segments first (the larger activations for images), then b's.
  void set_checkpointed(int64_t count) override;
  void set_recompute(Recompute mode) override;

 private:
  std::shared_ptr<Classifier> a_, b_;
  int64_t embed_dim_;
};

// Builds the dual encoder for a pair file whose tower a input is `input`
// (kind features or images, sample shape) and tower b input is
// input.context_features wide; tower a from cfg.seed, tower b from
// cfg.seed + 1. Throws memtrain::Error for /tokens pairs (clip's).
std::shared_ptr<DualEncoder> make_dual_encoder(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
