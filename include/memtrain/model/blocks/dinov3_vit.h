#pragma once
// Meta's DINOv3 ViT (facebookresearch/dinov3, dinov3/models/
// vision_transformer.py and dinov3/layers/) as a frozen feature extractor,
// with Meta's module names in Meta's registration order, so that
// state_tensors() is Meta's state_dict() less mask_token (only ever added
// as 0 * mask_token to the class token):
//   cls_token [1,1,D], storage_tokens [1,4,D],
//   patch_embed.proj.{weight,bias} (Conv2d 16x16, stride 16),
//   rope_embed.periods [E/4] (a buffer: loaded as the file stores it),
//   blocks.N.{norm1, attn.qkv (+ buffer bias_mask [3D]), attn.proj, ls1.gamma,
//             norm2, mlp.fc1, mlp.fc2, ls2.gamma},
//   norm
// Tokens: [class; 4 storage; patches (row-major)], no absolute position
// embedding. A block: x += ls1 * attn(norm1(x)); x += ls2 * mlp(norm2(x)),
// LayerNorm eps 1e-5, MLP 4x with GELU (erf). Attention: one qkv linear
// whose bias is multiplied by bias_mask (Meta's LinearKMaskedBias: the key
// part is 0), axial 2D RoPE on the patch tokens' q and k (below), then
// kept_attention (checkpointed.h). Note [DINOv3 as Meta's] in ARCHITECTURE.md.
//
// RoPE as Meta applies it at evaluation (RopePositionEmbedding, normalize
// "separate"): a patch (r, c) of an h x w grid sits at
// (2 (r + 0.5) / h - 1, 2 (c + 0.5) / w - 1); angle 2 pi coord / periods_j
// per axis and period, theta = [y angles, x angles] twice; q and k of the
// patch tokens become x cos theta + rotate_half(x) sin theta in float32
// (rotate_half([a, b]) = [-b, a]). The class and storage tokens are not
// rotated. The training-time jitter, shift and rescale of the coordinates
// do not exist here: the backbone is never trained.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace memtrain {

// A DINOv3 size (dinov3/hub/backbones.py): vits16, vitb16, and tiny (for
// tests: D 64, 4 blocks, 2 heads).
struct Dinov3Spec {
  std::string variant;
  int64_t dim = 384, depth = 12, heads = 6;
  int64_t patch = 16, storage_tokens = 4;
  double mlp_ratio = 4.0;
  double rope_base = 100.0;
  double eps = 1e-5;
  double layerscale_init = 1e-5;
  // The blocks whose outputs are the features: Meta's segmentation
  // evaluation's four even intervals, i * (depth / 4) - 1.
  std::vector<int64_t> layers;
};

// The variants, in the order the refusal names them.
const std::vector<std::string>& dinov3_variants();
// The spec of `variant` ("auto": vits16). Throws memtrain::Error naming
// `variant` and the variants there are.
Dinov3Spec dinov3_spec(const std::string& variant);

// The patch features of chosen blocks: each block's output through the
// final norm, class token and patch maps.
struct Dinov3Features {
  std::vector<int64_t> layers;
  std::vector<torch::Tensor> maps;  // (B, D, h, w) per layer
  std::vector<torch::Tensor> cls;   // (B, D) per layer
};

class Dinov3Rope : public torch::nn::Module {
 public:
  Dinov3Rope(int64_t head_dim, double base);
  // (sin, cos), each (h * w, head_dim), float32, shared by heads and batch.
  std::pair<torch::Tensor, torch::Tensor> sincos(int64_t h, int64_t w) const;
  const torch::Tensor& periods() const {
    return periods_;
  }

 private:
  torch::Tensor periods_;
};

// x (..., N, E) -> x cos + rotate_half(x) sin, in float32, for the last N
// rows of x that sin and cos cover (the first N - rows untouched); the
// result in x's dtype.
torch::Tensor dinov3_rope_apply(
    const torch::Tensor& x, const torch::Tensor& sin, const torch::Tensor& cos);

class Dinov3Block : public torch::nn::Module {
 public:
  explicit Dinov3Block(const Dinov3Spec& spec);
  torch::Tensor forward(
      const torch::Tensor& x,
      const torch::Tensor& sin,
      const torch::Tensor& cos);

 private:
  int64_t heads_;
  torch::nn::LayerNorm norm1_{nullptr}, norm2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc1_{nullptr}, fc2_{nullptr};
  torch::Tensor bias_mask_, gamma1_, gamma2_;
};

class Dinov3Vit : public torch::nn::Module {
 public:
  // PyTorch's default initialisation of the layers, the tokens N(0, 0.02),
  // bias_mask [1, 0, 1], layer scales spec.layerscale_init, drawn from
  // LibTorch's default generator.
  explicit Dinov3Vit(const Dinov3Spec& spec);
  const Dinov3Spec& spec() const {
    return spec_;
  }
  // images (B, 3, H, W), H and W multiples of 16 (else memtrain::Error) ->
  // the outputs of blocks `layers` (ascending, each < depth); runs the
  // blocks up to the last of them only.
  Dinov3Features forward_features(
      const torch::Tensor& images, const std::vector<int64_t>& layers);

 private:
  Dinov3Spec spec_;
  torch::Tensor cls_token_, storage_tokens_;
  torch::nn::Conv2d proj_{nullptr};
  std::shared_ptr<Dinov3Rope> rope_;
  std::vector<std::shared_ptr<Dinov3Block>> blocks_;
  torch::nn::LayerNorm norm_{nullptr};
};

}  // namespace memtrain
