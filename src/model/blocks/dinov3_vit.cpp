#include "memtrain/model/blocks/dinov3_vit.h"

#include <cmath>
#include <string>

#include "memtrain/compat.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/blocks/transformer.h"
#include "memtrain/util/error.h"

namespace memtrain {

namespace nn = torch::nn;

const std::vector<std::string>& dinov3_variants() {
  static const std::vector<std::string> v{"vits16", "vitb16", "tiny"};
  return v;
}

Dinov3Spec dinov3_spec(const std::string& asked) {
  const std::string variant = asked == "auto" ? "vits16" : asked;
  Dinov3Spec s;
  s.variant = variant;
  if (variant == "vits16") {
    s.dim = 384, s.depth = 12, s.heads = 6;
  } else if (variant == "vitb16") {
    s.dim = 768, s.depth = 12, s.heads = 12;
  } else if (variant == "tiny") {
    s.dim = 64, s.depth = 4, s.heads = 2;
  } else {
    std::string names;
    for (const auto& v : dinov3_variants())
      names += (names.empty() ? "" : ", ") + v;
    throw Error(
        "model.variant: '" + variant + "' is not a DINOv3 size memtrain has (" +
        names + "; the SwiGLU sizes S+ and H+ and the 7B are not supported)");
  }
  const int64_t step = s.depth / 4;
  for (int64_t i = 1; i <= 4; ++i)
    s.layers.push_back(i * step - 1);
  return s;
}

Dinov3Rope::Dinov3Rope(int64_t head_dim, double base) {
  MT_CHECK(head_dim % 4 == 0, "dinov3: head dim ", head_dim, " is not 4k");
  // Meta's RopePositionEmbedding._init_weights, in float32.
  periods_ = register_buffer(
      "periods",
      torch::pow(
          base,
          2 * torch::arange(head_dim / 4, torch::kFloat32) / (head_dim / 2)));
}

std::pair<torch::Tensor, torch::Tensor> Dinov3Rope::sincos(
    int64_t h, int64_t w) const {
  const auto f32 =
      torch::TensorOptions(torch::kFloat32).device(periods_.device());
  const torch::Tensor cy = torch::arange(0.5, double(h), f32) / h;
  const torch::Tensor cx = torch::arange(0.5, double(w), f32) / w;
  const auto grid = torch::meshgrid({cy, cx}, "ij");
  torch::Tensor coords = torch::stack({grid[0], grid[1]}, -1).flatten(0, 1);
  coords = 2.0 * coords - 1.0;  // (h w, 2) in [-1, 1]
  const torch::Tensor angles =
      (2 * M_PI * coords.unsqueeze(-1) / periods_.to(torch::kFloat32))
          .flatten(1, 2)
          .repeat({1, 2});  // (h w, E): [y, x, y, x] angles
  return {torch::sin(angles), torch::cos(angles)};
}

torch::Tensor dinov3_rope_apply(
    const torch::Tensor& x,
    const torch::Tensor& sin,
    const torch::Tensor& cos) {
  const int64_t rows = sin.size(0), n = x.size(-2);
  const torch::Tensor t = x.narrow(-2, n - rows, rows).to(torch::kFloat32);
  const int64_t half = t.size(-1) / 2;
  const torch::Tensor rotated =
      torch::cat({-t.narrow(-1, half, half), t.narrow(-1, 0, half)}, -1);
  const torch::Tensor out = (t * cos + rotated * sin).to(x.scalar_type());
  return torch::cat({x.narrow(-2, 0, n - rows), out}, -2);
}

Dinov3Block::Dinov3Block(const Dinov3Spec& spec) : heads_(spec.heads) {
  const int64_t d = spec.dim;
  MT_CHECK(d % heads_ == 0, "dinov3: width ", d, " among ", heads_, " heads");
  const auto ln = nn::LayerNormOptions({d}).eps(spec.eps);
  norm1_ = register_module("norm1", nn::LayerNorm(ln));
  auto attn = register_module("attn", std::make_shared<nn::Module>());
  qkv_ = attn->register_module("qkv", nn::Linear(d, 3 * d));
  bias_mask_ = qkv_->register_buffer(
      "bias_mask",
      torch::cat({torch::ones({d}), torch::zeros({d}), torch::ones({d})}));
  proj_ = attn->register_module("proj", nn::Linear(d, d));
  auto ls1 = register_module("ls1", std::make_shared<nn::Module>());
  gamma1_ =
      ls1->register_parameter("gamma", torch::full({d}, spec.layerscale_init));
  norm2_ = register_module("norm2", nn::LayerNorm(ln));
  auto mlp = register_module("mlp", std::make_shared<nn::Module>());
  const auto hidden = static_cast<int64_t>(d * spec.mlp_ratio);
  fc1_ = mlp->register_module("fc1", nn::Linear(d, hidden));
  fc2_ = mlp->register_module("fc2", nn::Linear(hidden, d));
  auto ls2 = register_module("ls2", std::make_shared<nn::Module>());
  gamma2_ =
      ls2->register_parameter("gamma", torch::full({d}, spec.layerscale_init));
}

torch::Tensor Dinov3Block::forward(
    const torch::Tensor& x,
    const torch::Tensor& sin,
    const torch::Tensor& cos) {
  const int64_t b = x.size(0), n = x.size(1), d = x.size(2);
  const int64_t e = d / heads_;
  // (B, N, 3D) -> (3, B, H, N, E)
  const torch::Tensor qkv =
      kept_linear(
          layer_norm_as_input(norm1_, x), qkv_->weight, qkv_->bias * bias_mask_)
          .view({b, n, 3, heads_, e})
          .permute({2, 0, 3, 1, 4});
  const torch::Tensor o = kept_attention(
      dinov3_rope_apply(qkv[0], sin, cos),
      dinov3_rope_apply(qkv[1], sin, cos),
      qkv[2],
      {},
      1.0 / std::sqrt(double(e)),
      /*causal=*/false);
  const torch::Tensor y =
      x + gamma1_ * kept_linear(proj_, o.transpose(1, 2).reshape({b, n, d}));
  return y + gamma2_ * kept_linear(
                           fc2_,
                           torch::gelu(kept_linear(
                               fc1_, layer_norm_as_input(norm2_, y))));
}

Dinov3Vit::Dinov3Vit(const Dinov3Spec& spec) : spec_(spec) {
  const int64_t d = spec.dim;
  cls_token_ =
      register_parameter("cls_token", torch::randn({1, 1, d}).mul_(0.02));
  storage_tokens_ = register_parameter(
      "storage_tokens", torch::randn({1, spec.storage_tokens, d}).mul_(0.02));
  auto patch_embed =
      register_module("patch_embed", std::make_shared<nn::Module>());
  proj_ = patch_embed->register_module(
      "proj",
      nn::Conv2d(nn::Conv2dOptions(3, d, spec.patch).stride(spec.patch)));
  rope_ = register_module(
      "rope_embed",
      std::make_shared<Dinov3Rope>(d / spec.heads, spec.rope_base));
  auto list = register_module("blocks", std::make_shared<nn::Module>());
  for (int64_t i = 0; i < spec.depth; ++i)
    blocks_.push_back(list->register_module(
        std::to_string(i), std::make_shared<Dinov3Block>(spec)));
  norm_ = register_module(
      "norm", nn::LayerNorm(nn::LayerNormOptions({d}).eps(spec.eps)));
}

Dinov3Features Dinov3Vit::forward_features(
    const torch::Tensor& images, const std::vector<int64_t>& layers) {
  MT_CHECK(
      images.dim() == 4 && images.size(1) == 3,
      "dinov3: the backbone takes (B, 3, H, W) images, not ",
      images.sizes());
  const int64_t p = spec_.patch;
  MT_CHECK(
      images.size(2) % p == 0 && images.size(3) % p == 0,
      "dinov3: an image of ",
      images.size(2),
      "x",
      images.size(3),
      " is not a multiple of the ",
      p,
      "-pixel patch in both sides; crop or pad it to one");
  MT_CHECK(!layers.empty(), "dinov3: no layers asked for");
  for (size_t i = 0; i < layers.size(); ++i)
    MT_CHECK(
        layers[i] >= 0 && layers[i] < spec_.depth &&
            (i == 0 || layers[i] > layers[i - 1]),
        "dinov3: layers must ascend within [0, ",
        spec_.depth,
        "), not ",
        torch::IntArrayRef(layers));
  const int64_t b = images.size(0), d = spec_.dim;
  const int64_t h = images.size(2) / p, w = images.size(3) / p;
  const int64_t prefix = 1 + spec_.storage_tokens;
  const torch::Tensor patches =
      proj_->forward(images).flatten(2).transpose(1, 2);
  // As torch.cat promotes: float32 tokens keep float32 patches (autocast's
  // bfloat16 convolution) from rounding them.
  const auto dt =
      at::promote_types(patches.scalar_type(), cls_token_.scalar_type());
  torch::Tensor x = torch::cat(
      {cls_token_.expand({b, 1, d}).to(dt),
       storage_tokens_.expand({b, spec_.storage_tokens, d}).to(dt),
       patches.to(dt)},
      1);
  const auto [sin, cos] = rope_->sincos(h, w);
  Dinov3Features out;
  out.layers = layers;
  size_t next = 0;
  for (int64_t i = 0; next < layers.size(); ++i) {
    x = blocks_[i]->forward(x, sin, cos);
    if (i != layers[next])
      continue;
    ++next;
    const torch::Tensor z = layer_norm_as_input(norm_, x);
    out.cls.push_back(z.select(1, 0));
    out.maps.push_back(
        z.narrow(1, prefix, h * w).reshape({b, h, w, d}).permute({0, 3, 1, 2}));
  }
  return out;
}

}  // namespace memtrain
