#pragma once
// Few-shot heads (model.head: prototype | cosine | cosine_transformer) on
// any backbone: the backbone (the Classifier make_model builds, with
// model.embed_dim outputs) maps a sample to an embedding; an episode's class
// prototypes are the mean embeddings of its support samples, and a query's
// logits are
//   prototype: -||q - p_j||^2
//   cosine:    s * cos(q, p_j), s learnable (model.cosine_scale at start)
//   cosine_transformer: FS-CT's (cosine_transformer.h), whose prototypes
//              are a learnable weighting of the support embeddings
// The loss of an episode is the mean cross-entropy over its queries.

#include <torch/torch.h>

#include <memory>
#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/data/sampling/episodes.h"
#include "memtrain/model/blocks/cosine_transformer.h"
#include "memtrain/model/models.h"

namespace memtrain {

class FewShotModel : public Classifier {
 public:
  // Parameter names: "backbone.<the backbone's>" and, for cosine, "scale",
  // for cosine_transformer "fsct.<the head's>". `shape`: the episodes the
  // model scores (cosine_transformer's prototype weights are per shot).
  FewShotModel(
      std::shared_ptr<Classifier> backbone,
      const ModelConfig& cfg,
      const EpisodeShape& shape);
  using Classifier::forward;
  // The embeddings (N, embed_dim).
  torch::Tensor forward(torch::Tensor x) override;
  void set_checkpointed(int64_t count) override;
  void set_recompute(Recompute mode) override;

  Head head_kind() const {
    return head_;
  }
  // Logits (n, n_way * n_query, n_way) of the n episodes whose embeddings
  // `emb` (n * shape.rows(), D) holds, laid out as EpisodeShape says.
  torch::Tensor episode_logits(
      const torch::Tensor& emb, const EpisodeShape& shape) const;

 private:
  std::shared_ptr<Classifier> backbone_;
  Head head_;
  torch::Tensor scale_;                  // cosine only
  CosineTransformerHead fsct_{nullptr};  // cosine_transformer only
};

// make_model's backbone for `input` with cfg.embed_dim outputs, under a
// few-shot head for episodes of `shape`; initialised from cfg.seed alone.
std::shared_ptr<FewShotModel> make_fewshot_model(
    const ModelConfig& cfg, const ModelInput& input, const EpisodeShape& shape);

// The query labels (n, n_way * n_query) of episode labels `y` (n, rows).
torch::Tensor query_labels(const torch::Tensor& y, const EpisodeShape& shape);
// Sum over the n episodes of each one's mean query cross-entropy: the
// per-sample loss of Note [Window weighting] with an episode as the sample.
torch::Tensor episode_loss_sum(
    const torch::Tensor& logits, const torch::Tensor& labels);
// Each episode's correctly classified queries (n,), int64.
torch::Tensor episode_correct(
    const torch::Tensor& logits, const torch::Tensor& labels);

}  // namespace memtrain
