#include "memtrain/model/blocks/transformer.h"

#include <cmath>
#include <string>

#include "memtrain/compat.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/util/error.h"

namespace memtrain {

namespace nn = torch::nn;

torch::Tensor activate(const torch::Tensor& x, Activation act) {
  if (act == Activation::kQuickGelu)
    return x * torch::sigmoid(1.702 * x);
  return torch::gelu(x);
}

torch::Tensor layer_norm_as_input(nn::LayerNorm& norm, const torch::Tensor& x) {
  return norm->forward(x.to(torch::kFloat32)).to(x.scalar_type());
}

// nn.MultiheadAttention's initialisation: in_proj_weight Xavier-uniform,
// both biases zero, out_proj.weight as nn.Linear's.
MultiheadAttention::MultiheadAttention(int64_t width, int64_t heads)
    : heads_(heads) {
  MT_CHECK(
      heads > 0 && width % heads == 0,
      "transformer: width ",
      width,
      " does not divide among ",
      heads,
      " heads");
  in_proj_weight_ = register_parameter(
      "in_proj_weight",
      nn::init::xavier_uniform_(torch::empty({3 * width, width})));
  in_proj_bias_ = register_parameter("in_proj_bias", torch::zeros({3 * width}));
  out_proj_ = register_module("out_proj", nn::Linear(width, width));
  torch::NoGradGuard no_grad;
  out_proj_->bias.zero_();
}

torch::Tensor MultiheadAttention::forward(const torch::Tensor& x, bool causal) {
  const int64_t n = x.size(0), l = x.size(1), w = x.size(2);
  const int64_t e = w / heads_;
  // (N, L, 3W) -> (3, N, H, L, E)
  const torch::Tensor qkv = kept_linear(x, in_proj_weight_, in_proj_bias_)
                                .view({n, l, 3, heads_, e})
                                .permute({2, 0, 3, 1, 4});
  const torch::Tensor o = kept_attention(
      qkv[0], qkv[1], qkv[2], {}, 1.0 / std::sqrt(double(e)), causal);
  return kept_linear(out_proj_, o.transpose(1, 2).reshape({n, l, w}));
}

ResidualAttentionBlock::ResidualAttentionBlock(
    int64_t width, int64_t heads, double mlp_ratio, Activation act)
    : act_(act) {
  const int64_t hidden = static_cast<int64_t>(width * mlp_ratio);
  ln_1_ = register_module("ln_1", nn::LayerNorm(nn::LayerNormOptions({width})));
  attn_ = register_module(
      "attn", std::make_shared<MultiheadAttention>(width, heads));
  ln_2_ = register_module("ln_2", nn::LayerNorm(nn::LayerNormOptions({width})));
  auto mlp = register_module("mlp", std::make_shared<nn::Module>());
  c_fc_ = mlp->register_module("c_fc", nn::Linear(width, hidden));
  c_proj_ = mlp->register_module("c_proj", nn::Linear(hidden, width));
}

torch::Tensor ResidualAttentionBlock::forward(
    const torch::Tensor& x, bool causal) {
  torch::Tensor y = x + attn_->forward(layer_norm_as_input(ln_1_, x), causal);
  return y +
         kept_linear(
             c_proj_,
             activate(kept_linear(c_fc_, layer_norm_as_input(ln_2_, y)), act_));
}

Transformer::Transformer(
    int64_t width,
    int64_t layers,
    int64_t heads,
    double mlp_ratio,
    Activation act) {
  auto list = register_module("resblocks", std::make_shared<nn::Module>());
  for (int64_t i = 0; i < layers; ++i) {
    blocks_.push_back(list->register_module(
        std::to_string(i),
        std::make_shared<ResidualAttentionBlock>(
            width, heads, mlp_ratio, act)));
  }
}

torch::Tensor Transformer::forward(
    torch::Tensor x, bool causal, int64_t checkpointed, Recompute mode) {
  for (int64_t i = 0; i < layers(); ++i) {
    ResidualAttentionBlock* b = blocks_[i].get();
    if (i < checkpointed) {
      x = checkpoint(
          [b, causal](const at::Tensor& t) { return b->forward(t, causal); },
          x,
          mode);
    } else {
      x = b->forward(x, causal);
    }
  }
  return x;
}

}  // namespace memtrain
