#include "memtrain/model/blocks/fewshot_head.h"

#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {

FewShotModel::FewShotModel(
    std::shared_ptr<Classifier> backbone,
    const ModelConfig& cfg,
    const EpisodeShape& shape)
    : backbone_(std::move(backbone)), head_(cfg.head) {
  MT_INTERNAL_ASSERT(head_ != Head::kLinear);
  register_module("backbone", backbone_);
  segment_names_ = backbone_->segment_names();
  for (auto& name : segment_names_)
    name = "backbone." + name;
  if (head_ == Head::kCosine) {
    scale_ = register_parameter(
        "scale", torch::full({1}, cfg.cosine_scale, torch::kFloat32));
  }
  if (head_ == Head::kCosineTransformer) {
    fsct_ = register_module(
        "fsct",
        CosineTransformerHead(
            cfg.embed_dim, cfg.fsct, shape.n_way, shape.k_shot));
  }
}

torch::Tensor FewShotModel::forward(torch::Tensor x) {
  return backbone_->forward(x);
}

void FewShotModel::set_checkpointed(int64_t count) {
  Classifier::set_checkpointed(count);
  backbone_->set_checkpointed(count);
}

void FewShotModel::set_recompute(Recompute mode) {
  Classifier::set_recompute(mode);
  backbone_->set_recompute(mode);
}

torch::Tensor FewShotModel::episode_logits(
    const torch::Tensor& emb, const EpisodeShape& shape) const {
  const int64_t rows = shape.rows();
  MT_INTERNAL_ASSERT(emb.dim() == 2 && emb.size(0) % rows == 0);
  const int64_t n = emb.size(0) / rows, d = emb.size(1);
  const torch::Tensor e = emb.view({n, rows, d});
  const torch::Tensor q = e.slice(1, shape.support(), rows);  // (n, NQ, D)
  if (head_ == Head::kCosineTransformer) {
    const torch::Tensor support =
        e.slice(1, 0, shape.support())
            .reshape({n, shape.n_way, shape.k_shot, d});
    return fsct_.ptr()->forward(support, q);
  }
  const torch::Tensor protos = e.slice(1, 0, shape.support())
                                   .reshape({n, shape.n_way, shape.k_shot, d})
                                   .mean(2);  // (n, N, D)
  if (head_ == Head::kPrototype)
    return -(q.unsqueeze(2) - protos.unsqueeze(1)).pow(2).sum(-1);
  namespace F = torch::nn::functional;
  const auto unit = F::NormalizeFuncOptions().dim(-1).eps(1e-12);
  return scale_ *
         torch::bmm(
             F::normalize(q, unit), F::normalize(protos, unit).transpose(1, 2));
}

std::shared_ptr<FewShotModel> make_fewshot_model(
    const ModelConfig& cfg,
    const ModelInput& input,
    const EpisodeShape& shape) {
  ModelInput embed = input;
  embed.num_classes = cfg.embed_dim;
  ModelConfig backbone = cfg;
  backbone.num_classes = cfg.embed_dim;
  // make_model seeds the generator; the scale is a constant, and the
  // transformer head draws its weights next, from the same generator.
  return std::make_shared<FewShotModel>(
      make_model(backbone, embed), cfg, shape);
}

torch::Tensor query_labels(const torch::Tensor& y, const EpisodeShape& shape) {
  return y.view({-1, shape.rows()}).slice(1, shape.support(), shape.rows());
}

torch::Tensor episode_loss_sum(
    const torch::Tensor& logits, const torch::Tensor& labels) {
  const int64_t classes = logits.size(2), queries = logits.size(1);
  return torch::nn::functional::cross_entropy(
             logits.reshape({-1, classes}),
             labels.reshape({-1}),
             torch::nn::functional::CrossEntropyFuncOptions().reduction(
                 torch::kSum)) /
         static_cast<double>(queries);
}

torch::Tensor episode_correct(
    const torch::Tensor& logits, const torch::Tensor& labels) {
  return logits.argmax(2).eq(labels).sum(1);
}

}  // namespace memtrain
