#include "memtrain/model/nets/clip.h"

#include <cmath>
#include <utility>

#include "memtrain/util/error.h"

namespace memtrain {

namespace nn = torch::nn;

// Note [CLIP as open_clip]
// ClipModel is open_clip 3.3.0's CLIP with a VisionTransformer image tower
// and the default TextTransformer (model_configs ViT-B-32.json and
// ViT-B-16.json: no layer scale, no patch dropout, class-token pooling,
// ln_post before the pool, argmax (end-of-text) pooling of the text,
// projections without bias), module for module with open_clip's names and
// registration order, so that named_parameters() is open_clip's
// state_dict() in order (its one buffer, the causal attn_mask, is not
// persistent: here the mask is compat::attention's `causal`). The forward
// is open_clip's operation for operation:
//   image: conv1 (patches, no bias) -> (N, g*g, W) -> [class token; x] +
//          positional -> ln_pre -> blocks -> ln_post -> token 0 -> @ proj
//   text:  token_embedding + positional -> causal blocks -> ln_final ->
//          the row of each text's largest id (the end token) ->
//          @ text_projection
// then both L2-normalised; the logits of pair (i, j) are exp(logit_scale)
// <image_i, text_j>, as open_clip's CLIP.forward returns them. The
// initialisation is open_clip's scheme (VisionTransformer keeps PyTorch's
// defaults; TextTransformer.init_parameters' normal draws), drawn from
// model.seed. tests/e2e/clip_open_clip.sh builds open_clip's model with
// memtrain's weights and compares names, shapes, order and logits.

ClipSpec clip_spec(const std::string& asked) {
  const std::string variant = asked == "auto" ? "ViT-B-32" : asked;
  const std::string quick = "-quickgelu";
  std::string base = variant;
  ClipSpec s;
  s.variant = variant;
  if (base.size() > quick.size() &&
      base.compare(base.size() - quick.size(), quick.size(), quick) == 0) {
    base.resize(base.size() - quick.size());
    s.act = Activation::kQuickGelu;
  }
  if (base == "ViT-B-32" || base == "ViT-B-16") {
    s.patch_size = base == "ViT-B-32" ? 32 : 16;
    return s;
  }
  if (base == "tiny") {
    s.embed_dim = 32;
    s.patch_size = 8;
    s.vision_width = s.text_width = 64;
    s.vision_layers = s.text_layers = 2;
    s.vision_heads = s.text_heads = 4;
    return s;
  }
  throw Error(
      "model.variant='" + variant +
      "' is not a CLIP memtrain builds; use ViT-B-32, ViT-B-16 or tiny "
      "(open_clip's model config names), optionally with -quickgelu");
}

ClipModel::ClipModel(
    const ClipSpec& spec,
    int64_t image_size,
    int64_t context_length,
    double init_temperature)
    : spec_(spec), image_size_(image_size), context_length_(context_length) {
  const int64_t w = spec.text_width;
  // open_clip registers, in this order: visual, transformer,
  // token_embedding, positional_embedding, ln_final, text_projection,
  // logit_scale (state_dict: the parameters of CLIP itself first, then its
  // modules').
  VisionTransformerSpec visual;
  visual.image_size = image_size;
  visual.patch_size = spec.patch_size;
  visual.width = spec.vision_width;
  visual.layers = spec.vision_layers;
  visual.heads = spec.vision_heads;
  visual.mlp_ratio = spec.mlp_ratio;
  visual.act = spec.act;
  visual.output_dim = spec.embed_dim;
  visual_ =
      register_module("visual", std::make_shared<VisionTransformer>(visual));
  transformer_ = register_module(
      "transformer",
      std::make_shared<Transformer>(
          w, spec.text_layers, spec.text_heads, spec.mlp_ratio, spec.act));
  token_embedding_ =
      register_module("token_embedding", nn::Embedding(spec.vocab_size, w));
  positional_embedding_ = register_parameter(
      "positional_embedding", torch::empty({context_length, w}));
  ln_final_ =
      register_module("ln_final", nn::LayerNorm(nn::LayerNormOptions({w})));
  text_projection_ =
      register_parameter("text_projection", torch::empty({w, spec.embed_dim}));
  register_logit_scale(init_temperature);

  // TextTransformer.init_parameters.
  torch::NoGradGuard no_grad;
  const double attn_std = 1.0 / std::sqrt(double(w));
  const double proj_std = attn_std / std::sqrt(2.0 * spec.text_layers);
  const double fc_std = 1.0 / std::sqrt(2.0 * w);
  token_embedding_->weight.normal_(0, 0.02);
  positional_embedding_.normal_(0, 0.01);
  const auto ends_with = [](const std::string& s, const std::string& t) {
    return s.size() >= t.size() &&
           s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  for (auto& p : transformer_->named_parameters()) {
    if (ends_with(p.key(), "attn.in_proj_weight"))
      p.value().normal_(0, attn_std);
    else if (ends_with(p.key(), "attn.out_proj.weight"))
      p.value().normal_(0, proj_std);
    else if (ends_with(p.key(), "mlp.c_fc.weight"))
      p.value().normal_(0, fc_std);
    else if (ends_with(p.key(), "mlp.c_proj.weight"))
      p.value().normal_(0, proj_std);
  }
  text_projection_.normal_(0, attn_std);

  for (int64_t i = 0; i < spec.vision_layers; ++i)
    segment_names_.push_back(
        "visual.transformer.resblocks." + std::to_string(i));
  for (int64_t i = 0; i < spec.text_layers; ++i)
    segment_names_.push_back("transformer.resblocks." + std::to_string(i));
}

torch::Tensor ClipModel::encode_image(const torch::Tensor& images) {
  MT_CHECK(
      images.dim() == 4 && images.size(1) == 3 &&
          images.size(2) == image_size_ && images.size(3) == image_size_,
      "clip: expected images (N, 3, ",
      image_size_,
      ", ",
      image_size_,
      "), got ",
      images.sizes());
  return visual_->forward(
      images, std::min(checkpointed(), spec_.vision_layers), recompute());
}

torch::Tensor ClipModel::encode_text(const torch::Tensor& tokens) {
  MT_CHECK(
      tokens.dim() == 2 && tokens.size(1) == context_length_,
      "clip: expected tokens (N, ",
      context_length_,
      "), got ",
      tokens.sizes());
  const torch::Tensor ids = tokens.to(torch::kLong);
  torch::Tensor x = token_embedding_->forward(ids) + positional_embedding_;
  x = transformer_->forward(
      x,
      /*causal=*/true,
      std::max<int64_t>(0, checkpointed() - spec_.vision_layers),
      recompute());
  x = layer_norm_as_input(ln_final_, x);
  const torch::Tensor rows = torch::arange(x.size(0), ids.options());
  const torch::Tensor pooled = x.index({rows, ids.argmax(-1)});
  return torch::matmul(pooled, text_projection_);
}

torch::Tensor ClipModel::forward(torch::Tensor images, torch::Tensor tokens) {
  return torch::stack(
      {unit(encode_image(images)), unit(encode_text(tokens))}, 1);
}

std::shared_ptr<ClipModel> make_clip(
    const ModelConfig& cfg, const ModelInput& input) {
  const ClipSpec spec = clip_spec(cfg.variant);
  MT_CHECK(
      input.kind == SampleKind::kImages && input.tokens,
      "model.name=clip needs a pair file of /images and /tokens (memtrain "
      "convert-captions writes one; docs/data-format.md, Pairs)");
  const auto& shape = input.sample_shape;
  MT_CHECK(
      shape.size() == 3 && shape[0] == 3 && shape[1] == shape[2] &&
          shape[1] % spec.patch_size == 0,
      "model.name=clip (",
      spec.variant,
      "): the images must be 3 x S x S with S a multiple of the patch size ",
      spec.patch_size,
      " (224 for open_clip's weights), got ",
      shape.size() == 3
          ? std::to_string(shape[0]) + " x " + std::to_string(shape[1]) +
                " x " + std::to_string(shape[2])
          : std::string("another shape"),
      "; convert with --size 224");
  MT_CHECK(
      input.token_max < spec.vocab_size,
      "model.name=clip: /tokens holds id ",
      input.token_max,
      ", beyond CLIP's vocabulary of ",
      spec.vocab_size,
      " (tokenize with memtrain convert-captions)");
  MT_CHECK(
      cfg.init_temperature > 0,
      "model.init_temperature must be > 0 (CLIP starts at 0.07)");
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  return std::make_shared<ClipModel>(
      spec, shape[1], input.context_features, cfg.init_temperature);
}

}  // namespace memtrain
