#pragma once
// The transformer building block of memtrain's transformer models: open_clip's
// ResidualAttentionBlock (open_clip/transformer.py, 3.3.0) with its module
// names, so that its parameters come out as open_clip's:
//   ln_1, attn (in_proj_weight, in_proj_bias, out_proj), ln_2,
//   mlp (c_fc, c_proj)
// and a Transformer of them under "resblocks.<i>". A block is pre-norm:
//   x = x + attn(ln_1(x));  x = x + mlp(ln_2(x))
// with mlp = c_proj(act(c_fc(x))), act GELU (erf) or QuickGELU
// (x * sigmoid(1.702 x), OpenAI's CLIP weights). Attention is
// kept_attention (checkpointed.h): scaled_dot_product_attention on
// LibTorch 2.x (a GPU's fused kernels), blocked attention on 1.13 (Note
// [Blocked attention]). Each block is one
// checkpoint segment (checkpointed.h). Layer norms run in float32 and hand
// back the input's dtype, as open_clip's LayerNorm does under autocast.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "memtrain/model/blocks/checkpointed.h"

namespace memtrain {

enum class Activation { kGelu, kQuickGelu };

torch::Tensor activate(const torch::Tensor& x, Activation act);

// nn.LayerNorm in float32, the result in x's dtype.
torch::Tensor layer_norm_as_input(
    torch::nn::LayerNorm& norm, const torch::Tensor& x);

// nn.MultiheadAttention(width, heads, batch_first=True) as open_clip calls
// it (self-attention, no dropout, need_weights=False).
class MultiheadAttention : public torch::nn::Module {
 public:
  MultiheadAttention(int64_t width, int64_t heads);
  // x (N, L, width) -> (N, L, width); causal: token i attends to tokens
  // <= i (the text transformer's mask).
  torch::Tensor forward(const torch::Tensor& x, bool causal);

 private:
  int64_t heads_;
  torch::Tensor in_proj_weight_, in_proj_bias_;
  torch::nn::Linear out_proj_{nullptr};
};

class ResidualAttentionBlock : public torch::nn::Module {
 public:
  ResidualAttentionBlock(
      int64_t width, int64_t heads, double mlp_ratio, Activation act);
  torch::Tensor forward(const torch::Tensor& x, bool causal);

 private:
  Activation act_;
  torch::nn::LayerNorm ln_1_{nullptr}, ln_2_{nullptr};
  std::shared_ptr<MultiheadAttention> attn_;
  torch::nn::Linear c_fc_{nullptr}, c_proj_{nullptr};
};

class Transformer : public torch::nn::Module {
 public:
  Transformer(
      int64_t width,
      int64_t layers,
      int64_t heads,
      double mlp_ratio,
      Activation act);
  int64_t layers() const {
    return static_cast<int64_t>(blocks_.size());
  }
  // x (N, L, width) through every block; block i runs as a checkpoint
  // segment (recomputed in backward as `mode` says) when i < checkpointed.
  torch::Tensor forward(
      torch::Tensor x, bool causal, int64_t checkpointed, Recompute mode);

 private:
  std::vector<std::shared_ptr<ResidualAttentionBlock>> blocks_;
};

}  // namespace memtrain
