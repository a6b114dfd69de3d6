#include "memtrain/model/nets/dual_encoder.h"

#include <cmath>

#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"

namespace memtrain {

torch::Tensor PairEncoder::unit(const torch::Tensor& z) {
  const torch::Tensor f = z.to(torch::kFloat32);
  return f / f.norm(2, 1, /*keepdim=*/true).clamp_min(1e-12);
}

void PairEncoder::register_logit_scale(double init_temperature) {
  logit_scale_ = register_parameter(
      "logit_scale",
      torch::full({}, std::log(1.0 / init_temperature), torch::kFloat32));
}

void PairEncoder::clamp_logit_scale() {
  torch::NoGradGuard no_grad;
  logit_scale_.clamp_(0.0, std::log(100.0));
}

DualEncoder::DualEncoder(
    std::shared_ptr<Classifier> a,
    std::shared_ptr<Classifier> b,
    double init_temperature,
    int64_t embed_dim)
    : a_(register_module("tower_a", std::move(a))),
      b_(register_module("tower_b", std::move(b))),
      embed_dim_(embed_dim) {
  register_logit_scale(init_temperature);
  for (const auto& n : a_->segment_names())
    segment_names_.push_back("tower_a." + n);
  for (const auto& n : b_->segment_names())
    segment_names_.push_back("tower_b." + n);
}

torch::Tensor DualEncoder::forward(torch::Tensor a, torch::Tensor b) {
  return torch::stack({unit(a_->forward(a)), unit(b_->forward(b))}, 1);
}

void DualEncoder::set_checkpointed(int64_t count) {
  Classifier::set_checkpointed(count);
  const int64_t in_a = std::min(count, a_->num_segments());
  a_->set_checkpointed(in_a);
  b_->set_checkpointed(count - in_a);
}

void DualEncoder::set_recompute(Recompute mode) {
  Classifier::set_recompute(mode);
  a_->set_recompute(mode);
  b_->set_recompute(mode);
}

std::shared_ptr<DualEncoder> make_dual_encoder(
    const ModelConfig& cfg, const ModelInput& input) {
  MT_CHECK(
      !input.tokens,
      "model.name=dual_encoder reads /features_b; a pair file of /images "
      "and /tokens (convert-captions) trains model.name=clip");
  MT_CHECK(
      input.kind == SampleKind::kFeatures || input.kind == SampleKind::kImages,
      "model.name=dual_encoder needs a pair file (/features_a or /images "
      "with /features_b; docs/data-format.md, Pairs)");
  MT_CHECK(
      cfg.embed_dim >= 2,
      "model.embed_dim=",
      cfg.embed_dim,
      ": the dual encoder's embeddings need at least 2 dimensions");
  MT_CHECK(
      cfg.init_temperature > 0,
      "model.init_temperature must be > 0 (CLIP starts at 0.07)");
  ModelConfig tower = cfg;
  tower.name =
      input.kind == SampleKind::kImages ? ModelName::kCnn : ModelName::kMlp;
  ModelInput in_a{input.kind, input.sample_shape, cfg.embed_dim, 0};
  auto a = make_model(tower, in_a);
  tower.name = ModelName::kMlp;
  tower.seed = cfg.seed + 1;
  ModelInput in_b{
      SampleKind::kFeatures, {input.context_features}, cfg.embed_dim, 0};
  auto b = make_model(tower, in_b);
  return std::make_shared<DualEncoder>(
      std::move(a), std::move(b), cfg.init_temperature, cfg.embed_dim);
}

}  // namespace memtrain
