#pragma once
// model.name: clip -- open_clip's CLIP (open_clip/model.py, transformer.py,
// 3.3.0): a ViT image tower and a causal text transformer, with open_clip's
// state-dict names, shapes and order (Note [CLIP as open_clip] in clip.cpp),
// so that an open_clip checkpoint loads through model.pretrained and a
// memtrain checkpoint loads into open_clip. Trained on pair files of /images
// and /tokens (docs/data-format.md, Pairs) with the symmetric InfoNCE of
// PairEncoder, exactly over the window (Note [Exact contrastive
// accumulation]).

#include <torch/torch.h>

#include <memory>
#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/model/blocks/transformer.h"
#include "memtrain/model/blocks/vision_transformer.h"
#include "memtrain/model/nets/dual_encoder.h"

namespace memtrain {

// The shapes of model.variant (open_clip's model_configs/<name>.json).
struct ClipSpec {
  std::string variant;
  int64_t embed_dim = 512;
  int64_t patch_size = 32;
  int64_t vision_width = 768, vision_layers = 12, vision_heads = 12;
  int64_t text_width = 512, text_layers = 12, text_heads = 8;
  int64_t vocab_size = 49408;
  double mlp_ratio = 4.0;
  Activation act = Activation::kGelu;
};

// ViT-B-32 (also "auto"), ViT-B-16, tiny, each optionally with -quickgelu.
// Throws
// memtrain::Error naming model.variant and the choices.
ClipSpec clip_spec(const std::string& variant);

class ClipModel : public PairEncoder {
 public:
  // Images image_size x image_size (a multiple of spec.patch_size), texts of
  // context_length tokens.
  ClipModel(
      const ClipSpec& spec,
      int64_t image_size,
      int64_t context_length,
      double init_temperature);
  using Classifier::forward;
  // images (n, 3, S, S) float; tokens (n, L) token ids (any dtype: read as
  // float32 from /tokens, exact). (n, 2, embed_dim) unit embeddings.
  torch::Tensor forward(torch::Tensor images, torch::Tensor tokens) override;
  int64_t embed_dim() const override {
    return spec_.embed_dim;
  }
  // open_clip's encode_image / encode_text, before the L2 normalisation.
  torch::Tensor encode_image(const torch::Tensor& images);
  torch::Tensor encode_text(const torch::Tensor& tokens);
  // Checkpoint segments (Classifier::set_checkpointed): the image tower's
  // blocks first (visual.transformer.resblocks.*), then the text tower's
  // (transformer.resblocks.*).

 private:
  ClipSpec spec_;
  int64_t image_size_, context_length_;
  // Text tower: open_clip's CLIP holds it at the top level.
  torch::Tensor positional_embedding_, text_projection_;
  std::shared_ptr<VisionTransformer> visual_;  // blocks/vision_transformer.h
  std::shared_ptr<Transformer> transformer_;
  torch::nn::Embedding token_embedding_{nullptr};
  torch::nn::LayerNorm ln_final_{nullptr};
};

// The ClipModel of model.variant for the pair file `input` describes
// (/images [3, S, S] and /tokens of L ids below the vocabulary), from
// cfg.seed. Throws memtrain::Error naming what does not fit.
std::shared_ptr<ClipModel> make_clip(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
