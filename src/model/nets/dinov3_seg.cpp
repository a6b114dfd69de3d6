#include "memtrain/model/nets/dinov3_seg.h"

#include <algorithm>
#include <string>

#include "memtrain/util/error.h"

namespace memtrain {

namespace nn = torch::nn;

Dinov3Segmenter::Dinov3Segmenter(
    const Dinov3Spec& spec,
    int64_t in_channels,
    int64_t num_classes,
    int64_t slice_axis,
    int64_t slice_chunk)
    : slice_axis_(slice_axis), slice_chunk_(slice_chunk) {
  MT_CHECK(
      in_channels == 1 || in_channels == 3,
      "model.name=dinov3: the volumes have ",
      in_channels,
      " channels; DINOv3 takes 3 (RGB) and memtrain repeats 1 to 3; "
      "convert the volumes to 1 or 3 channels");
  MT_CHECK(slice_axis >= 0 && slice_axis < 3, "model.slice_axis ", slice_axis);
  backbone_ = register_module("backbone", std::make_shared<Dinov3Vit>(spec));
  for (auto& p : backbone_->parameters())
    p.requires_grad_(false);
  backbone_->eval();
  const int64_t features = spec.dim * static_cast<int64_t>(spec.layers.size());
  head_ = register_module(
      "head", nn::Conv2d(nn::Conv2dOptions(features, num_classes, 1)));
}

void Dinov3Segmenter::train(bool on) {
  Classifier::train(on);
  backbone_->eval();
}

torch::Tensor Dinov3Segmenter::forward(torch::Tensor x) {
  MT_CHECK(x.dim() == 5, "model.name=dinov3: input ", x.sizes(), " is not 5-D");
  const int64_t n = x.size(0), c = x.size(1);
  const int64_t axis = 2 + slice_axis_;
  // (N, C, D, H, W) -> (N, S, C, A, B) -> (N S, 3, A, B)
  torch::Tensor s = x.movedim(axis, 1);
  const int64_t slices = s.size(1), a = s.size(3), b = s.size(4);
  s = s.reshape({n * slices, c, a, b});
  if (c == 1)
    s = s.expand({n * slices, 3, a, b});
  const Dinov3Spec& spec = backbone_->spec();
  const int64_t total = n * slices;
  const int64_t chunk = slice_chunk_ > 0 ? slice_chunk_ : total;
  torch::Tensor features;  // (N S, L D, a/16, b/16), no graph
  {
    torch::NoGradGuard no_grad;
    for (int64_t i = 0; i < total; i += chunk) {
      const int64_t len = std::min(chunk, total - i);
      Dinov3Features f =
          backbone_->forward_features(s.narrow(0, i, len), spec.layers);
      const torch::Tensor maps = torch::cat(f.maps, 1);
      f = Dinov3Features{};
      if (!features.defined()) {
        if (len == total) {
          features = maps;
          break;
        }
        std::vector<int64_t> shape = maps.sizes().vec();
        shape[0] = total;
        features = torch::empty(shape, maps.options());
      }
      features.narrow(0, i, len).copy_(maps);
    }
  }
  torch::Tensor logits = head_->forward(features);  // (N S, K, a/16, b/16)
  logits = nn::functional::interpolate(
      logits,
      nn::functional::InterpolateFuncOptions()
          .size(std::vector<int64_t>{a, b})
          .mode(torch::kBilinear)
          .align_corners(false));
  const int64_t k = logits.size(1);
  // (N, S, K, A, B) -> (N, K, S, A, B) -> S back at its axis.
  return logits.reshape({n, slices, k, a, b}).movedim(2, 1).movedim(2, axis);
}

std::shared_ptr<Classifier> make_dinov3(
    const ModelConfig& cfg, const ModelInput& input) {
  const auto& shape = input.sample_shape;  // [C, D, H, W]
  MT_CHECK(shape.size() == 4, "model.name=dinov3 trains on /volumes");
  const Dinov3Spec spec = dinov3_spec(cfg.variant);
  return std::make_shared<Dinov3Segmenter>(
      spec, shape[0], input.num_classes, cfg.slice_axis, cfg.slice_chunk);
}

}  // namespace memtrain
