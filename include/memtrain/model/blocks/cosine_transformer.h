#pragma once
// The few-shot cosine transformer head (model.head: cosine_transformer;
// ARCHITECTURE.md, Note [The few-shot cosine transformer]): FS-CT with
// cosine attention, Nguyen, Nguyen, Le, Pham, "Enhancing Few-shot Image
// Classification with Cosine Transformer", IEEE Access 2023
// (arXiv 2211.06828). Per episode, the class prototypes (a learnable
// softmax-weighted mean of the support embeddings) attend to each query
// embedding through cosine attention, and a cosine linear layer turns each
// (query, class) output into one logit. Every episode is computed on its
// own: no statistic crosses episodes, so Note [Episodes]'s exactness holds.

#include <torch/torch.h>

#include "memtrain/config/train_config.h"

namespace memtrain {

class CosineTransformerHeadImpl : public torch::nn::Module {
 public:
  // `dim`: the embedding width (model.embed_dim); the prototype weights
  // are (n_way, k_shot, 1), so the head is built for one episode shape.
  CosineTransformerHeadImpl(
      int64_t dim, const FsctConfig& cfg, int64_t n_way, int64_t k_shot);

  // Logits (n, NQ, N) of n episodes from their support embeddings
  // (n, N, K, D), class-major, and query embeddings (n, NQ, D).
  torch::Tensor forward(
      const torch::Tensor& support, const torch::Tensor& queries);

 private:
  // Cosine attention of `x` (n, 1 or NQ, N, D) to the queries (n, NQ, D):
  // (n, NQ, N, D), before the residual.
  torch::Tensor attend(const torch::Tensor& x, const torch::Tensor& queries);

  int64_t heads_, dim_head_, depth_;
  torch::Tensor proto_weight_;               // (N, K, 1)
  torch::nn::LayerNorm attn_norm_{nullptr};  // shared by q, k and v
  torch::nn::Linear attn_in_{nullptr};       // D -> heads * dim_head
  torch::nn::Linear attn_out_{nullptr};      // heads * dim_head -> D
  torch::nn::LayerNorm ffn_norm_{nullptr};   // pre-norm feed-forward
  torch::nn::Linear ffn_fc1_{nullptr};       // D -> mlp_dim, GELU
  torch::nn::Linear ffn_fc2_{nullptr};       // mlp_dim -> D
  torch::nn::LayerNorm out_norm_{nullptr};   // before the output layer
  torch::nn::Linear out_fc_{nullptr};        // D -> dim_head
  torch::Tensor cos_g_, cos_v_;  // the cosine layer's weight g * v / |v|
};
TORCH_MODULE(CosineTransformerHead);

}  // namespace memtrain
