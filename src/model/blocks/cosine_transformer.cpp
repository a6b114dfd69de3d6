// The few-shot cosine transformer head (Note [The few-shot cosine
// transformer] in ARCHITECTURE.md; cosine_transformer.h).

#include "memtrain/model/blocks/cosine_transformer.h"

#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

namespace F = torch::nn::functional;

// x / max(||x||, 1e-12) along the last axis: the unit vectors of a cosine.
torch::Tensor unit(const torch::Tensor& x) {
  return F::normalize(x, F::NormalizeFuncOptions().dim(-1).eps(1e-12));
}

}  // namespace

CosineTransformerHeadImpl::CosineTransformerHeadImpl(
    int64_t dim, const FsctConfig& cfg, int64_t n_way, int64_t k_shot)
    : heads_(cfg.heads), dim_head_(cfg.dim_head), depth_(cfg.depth) {
  MT_INTERNAL_ASSERT(
      dim > 0 && heads_ > 0 && dim_head_ > 0 && depth_ > 0 && n_way > 0 &&
      k_shot > 0 && cfg.mlp_dim > 0);
  const int64_t inner = heads_ * dim_head_;
  using torch::nn::LayerNormOptions;
  using torch::nn::LinearOptions;
  // Registration order fixes the draws from the generator make_model
  // seeded: the same model.seed gives the same head.
  proto_weight_ =
      register_parameter("proto_weight", torch::ones({n_way, k_shot, 1}));
  attn_norm_ = register_module(
      "attn_norm", torch::nn::LayerNorm(LayerNormOptions({dim})));
  attn_in_ = register_module(
      "attn_in", torch::nn::Linear(LinearOptions(dim, inner).bias(false)));
  // As the official code: no output projection when one head already has
  // the embedding's width.
  if (!(heads_ == 1 && dim_head_ == dim))
    attn_out_ = register_module(
        "attn_out", torch::nn::Linear(LinearOptions(inner, dim)));
  ffn_norm_ = register_module(
      "ffn_norm", torch::nn::LayerNorm(LayerNormOptions({dim})));
  ffn_fc1_ = register_module(
      "ffn_fc1", torch::nn::Linear(LinearOptions(dim, cfg.mlp_dim)));
  ffn_fc2_ = register_module(
      "ffn_fc2", torch::nn::Linear(LinearOptions(cfg.mlp_dim, dim)));
  out_norm_ = register_module(
      "out_norm", torch::nn::LayerNorm(LayerNormOptions({dim})));
  out_fc_ = register_module(
      "out_fc", torch::nn::Linear(LinearOptions(dim, dim_head_)));
  // The cosine layer's weight under weight normalisation, w = g v / |v|,
  // starting from a Linear(dim_head, 1) weight with g = |v| (w = v).
  const torch::Tensor v =
      torch::nn::Linear(LinearOptions(dim_head_, 1).bias(false))->weight;
  cos_v_ = register_parameter("cos_weight_v", v.detach().clone());
  cos_g_ = register_parameter(
      "cos_weight_g", v.detach().norm(2, {1}, /*keepdim=*/true));
}

torch::Tensor CosineTransformerHeadImpl::attend(
    const torch::Tensor& x, const torch::Tensor& queries) {
  const int64_t n = x.size(0), rows = x.size(1), ways = x.size(2);
  const int64_t nq = queries.size(1);
  // One projection (LayerNorm + Linear, no bias) for q, k and v; k = v.
  const torch::Tensor q =
      kept_linear(attn_in_, attn_norm_(x))
          .view({n, rows, ways, heads_, dim_head_});  // (n, 1|NQ, N, h, dh)
  const torch::Tensor kv = kept_linear(attn_in_, attn_norm_(queries))
                               .view({n, nq, 1, heads_, dim_head_});
  // Cosine attention: each head's cos(q, k), neither scaled nor
  // softmaxed, weighs v; a prototype meets one query at a time.
  const torch::Tensor cos = (unit(q) * unit(kv)).sum(-1, /*keepdim=*/true);
  torch::Tensor out = (cos * kv).flatten(3);  // (n, NQ, N, h * dh)
  return attn_out_ ? kept_linear(attn_out_, out) : out;
}

torch::Tensor CosineTransformerHeadImpl::forward(
    const torch::Tensor& support, const torch::Tensor& queries) {
  MT_INTERNAL_ASSERT(support.dim() == 4 && queries.dim() == 3);
  MT_INTERNAL_ASSERT(
      support.size(1) == proto_weight_.size(0) &&
      support.size(2) == proto_weight_.size(1));
  // Prototypes: the support embeddings weighted by a softmax over the
  // shots of each class's learnable weights (ones at start: the mean).
  torch::Tensor x = (support * proto_weight_.softmax(1)).sum(2).unsqueeze(1);
  for (int64_t i = 0; i < depth_; ++i) {
    x = attend(x, queries) + x;  // (n, NQ, N, D) from the first on
    x = kept_linear(
            ffn_fc2_, torch::gelu(kept_linear(ffn_fc1_, ffn_norm_(x)))) +
        x;
  }
  // The official CosineDistLinear, one logit per (query, class): y
  // divided by its norm over the classes plus 1e-5 (its torch.norm(x,
  // dim=1) of the (queries, classes, d) tensor), then 2 g (v / |v|) . that.
  const torch::Tensor y = kept_linear(out_fc_, out_norm_(x));  // (n, NQ, N, dh)
  const torch::Tensor over_classes = y / (y.norm(2, {2}, true) + 1e-5);
  return 2.0 * cos_g_.squeeze() *
         (over_classes * unit(cos_v_.squeeze(0))).sum(-1);
}

}  // namespace memtrain
