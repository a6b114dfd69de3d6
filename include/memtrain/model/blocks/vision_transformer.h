#pragma once
// open_clip's VisionTransformer (open_clip/transformer.py, 3.3.0), its
// module names and registration order: conv1 (patches, no bias),
// class_embedding, positional_embedding, ln_pre, transformer.resblocks.*,
// ln_post, and proj when it has an output width. Forward: conv1 ->
// (N, g*g, W) -> [class token; x] + positional -> ln_pre -> blocks ->
// ln_post -> token 0 [-> @ proj]. PyTorch's default initialisation of its
// modules, and open_clip's scale * randn for its own parameters, drawn from
// LibTorch's default generator. The image tower of model.name=clip
// (nets/clip.h) and the body of model.name=vit (nets/vit.h).

#include <torch/torch.h>

#include <memory>

#include "memtrain/model/blocks/transformer.h"

namespace memtrain {

struct VisionTransformerSpec {
  int64_t in_channels = 3;
  int64_t image_size = 224;  // a multiple of patch_size
  int64_t patch_size = 16;
  int64_t width = 768, layers = 12, heads = 12;
  double mlp_ratio = 4.0;
  Activation act = Activation::kGelu;
  int64_t output_dim = 0;  // proj's outputs; 0: no proj (the pooled width)
};

class VisionTransformer : public torch::nn::Module {
 public:
  explicit VisionTransformer(const VisionTransformerSpec& spec);
  // images (N, 3, S, S) -> (N, output_dim or width); blocks [0,
  // checkpointed) run as checkpoint segments recomputed as `mode` says.
  torch::Tensor forward(
      const torch::Tensor& images, int64_t checkpointed, Recompute mode);
  int64_t layers() const {
    return transformer_->layers();
  }

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::Tensor class_embedding_, positional_embedding_, proj_;
  torch::nn::LayerNorm ln_pre_{nullptr}, ln_post_{nullptr};
  std::shared_ptr<Transformer> transformer_;
};

}  // namespace memtrain
