#include "memtrain/model/blocks/vision_transformer.h"

#include <cmath>

namespace memtrain {

namespace nn = torch::nn;

VisionTransformer::VisionTransformer(const VisionTransformerSpec& s) {
  const int64_t w = s.width;
  const int64_t grid = s.image_size / s.patch_size;
  const double scale = 1.0 / std::sqrt(double(w));
  conv1_ = register_module(
      "conv1",
      nn::Conv2d(nn::Conv2dOptions(s.in_channels, w, s.patch_size)
                     .stride(s.patch_size)
                     .bias(false)));
  class_embedding_ =
      register_parameter("class_embedding", scale * torch::randn({w}));
  positional_embedding_ = register_parameter(
      "positional_embedding", scale * torch::randn({grid * grid + 1, w}));
  ln_pre_ = register_module("ln_pre", nn::LayerNorm(nn::LayerNormOptions({w})));
  transformer_ = register_module(
      "transformer",
      std::make_shared<Transformer>(w, s.layers, s.heads, s.mlp_ratio, s.act));
  ln_post_ =
      register_module("ln_post", nn::LayerNorm(nn::LayerNormOptions({w})));
  if (s.output_dim > 0) {
    proj_ = register_parameter("proj", scale * torch::randn({w, s.output_dim}));
  }
}

torch::Tensor VisionTransformer::forward(
    const torch::Tensor& images, int64_t checkpointed, Recompute mode) {
  torch::Tensor x = conv1_->forward(images);  // (N, W, g, g)
  const int64_t n = x.size(0), w = x.size(1);
  x = x.reshape({n, w, -1}).permute({0, 2, 1});  // (N, g*g, W)
  x = torch::cat(
      {class_embedding_.to(x.scalar_type()).expand({n, 1, w}), x}, 1);
  x = x + positional_embedding_.to(x.scalar_type());
  x = layer_norm_as_input(ln_pre_, x);
  x = transformer_->forward(x, /*causal=*/false, checkpointed, mode);
  x = layer_norm_as_input(ln_post_, x);
  x = x.select(1, 0);
  return proj_.defined() ? torch::matmul(x, proj_) : x;
}

}  // namespace memtrain
