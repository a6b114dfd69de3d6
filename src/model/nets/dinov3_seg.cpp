#include "memtrain/model/nets/dinov3_seg.h"

#include <algorithm>
#include <string>
#include <utility>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {

namespace nn = torch::nn;

namespace {

// The dtype the features are kept in: autocast's where it is on for x's
// device (AMP: the final norm hands them over in float32, twice the
// bytes), x's otherwise. The head's convolution would cast them to it
// anyway.
c10::ScalarType feature_dtype(const torch::Tensor& x) {
  const compat::AutocastState amp = compat::autocast_state();
  if (x.is_cuda() ? amp.cuda_enabled : amp.cpu_enabled)
    return x.is_cuda() ? amp.cuda_dtype : amp.cpu_dtype;
  return x.scalar_type();
}

}  // namespace

Dinov3Segmenter::Dinov3Segmenter(
    const Dinov3Spec& spec, const Dinov3SegOptions& opt)
    : opt_(opt) {
  MT_CHECK(
      opt.in_channels == 1 || opt.in_channels == 3,
      "model.name=dinov3: the volumes have ",
      opt.in_channels,
      " channels; DINOv3 takes 3 (RGB) and memtrain repeats 1 to 3; "
      "convert the volumes to 1 or 3 channels");
  MT_CHECK(
      opt.slice_axis >= 0 && opt.slice_axis < 3,
      "model.slice_axis ",
      opt.slice_axis);
  backbone_ = register_module("backbone", std::make_shared<Dinov3Vit>(spec));
  for (auto& p : backbone_->parameters())
    p.requires_grad_(false);
  backbone_->eval();
  const int64_t features = spec.dim * static_cast<int64_t>(spec.layers.size());
  const bool context = opt.context_scale > 0.0;
  if (context && opt.fusion == Fusion::kAdd)
    fuse_ = register_parameter("fuse", torch::ones({2, features}));
  const int64_t head_in =
      context && opt.fusion == Fusion::kConcat ? 2 * features : features;
  head_ = register_module(
      "head", nn::Conv2d(nn::Conv2dOptions(head_in, opt.num_classes, 1)));
}

void Dinov3Segmenter::train(bool on) {
  Classifier::train(on);
  backbone_->eval();
}

std::vector<std::pair<std::string, int64_t>>
Dinov3Segmenter::take_phase_peaks() {
  std::vector<std::pair<std::string, int64_t>> out;
  if (peak_backbone_ >= 0)
    out.emplace_back("backbone", peak_backbone_);
  if (peak_context_ >= 0)
    out.emplace_back("context", peak_context_);
  peak_backbone_ = peak_context_ = -1;
  return out;
}

namespace {

// Slices `idx` (ascending) of `s`: a view where they are one run.
torch::Tensor gather_slices(
    const torch::Tensor& s, const std::vector<int64_t>& idx) {
  const int64_t first = idx.front();
  const int64_t len = static_cast<int64_t>(idx.size());
  if (idx.back() - first + 1 == len)
    return s.narrow(0, first, len);
  std::vector<torch::Tensor> parts;
  for (size_t j = 0; j < idx.size();) {
    size_t e = j + 1;
    while (e < idx.size() && idx[e] == idx[e - 1] + 1)
      ++e;
    parts.push_back(s.narrow(0, idx[j], static_cast<int64_t>(e - j)));
    j = e;
  }
  return torch::cat(parts, 0);
}

}  // namespace

torch::Tensor Dinov3Segmenter::extract(
    const torch::Tensor& x,
    const torch::Tensor& origins,
    int64_t view,
    int64_t* peak) {
  memory::PeakScope scope;
  const int64_t n = x.size(0), c = x.size(1);
  // (N, C, D, H, W) -> (N, S, C, A, B) -> (N S, 3, A, B)
  torch::Tensor s = x.movedim(2 + opt_.slice_axis, 1);
  const int64_t slices = s.size(1), a = s.size(3), b = s.size(4);
  s = s.reshape({n * slices, c, a, b});
  if (c == 1)
    s = s.expand({n * slices, 3, a, b});
  const Dinov3Spec& spec = backbone_->spec();
  const int64_t total = n * slices;
  const int64_t chunk = opt_.slice_chunk > 0 ? opt_.slice_chunk : total;
  const c10::ScalarType dtype = feature_dtype(x);
  // Note [The feature cache]: the slices whose maps are kept are copied
  // back; the others (todo) run through the backbone.
  std::vector<SliceKey> keys;
  if (cache_ && origins.defined()) {
    MT_INTERNAL_ASSERT(origins.size(0) == n, "origins of another batch");
    keys = slice_keys(
        origins,
        {x.size(2), x.size(3), x.size(4)},
        opt_.slice_axis,
        view,
        static_cast<int64_t>(dtype));
  } else if (cache_) {
    cache_->missed(total);
  }
  std::vector<const torch::Tensor*> kept(static_cast<size_t>(total), nullptr);
  std::vector<int64_t> todo;
  for (int64_t i = 0; i < total; ++i) {
    if (!keys.empty())
      kept[i] = cache_->find(keys[i]);
    if (kept[i] == nullptr)
      todo.push_back(i);
  }
  const auto todo_count = static_cast<int64_t>(todo.size());
  torch::NoGradGuard no_grad;
  // (N S, L D, a/16, b/16), in the compute dtype. Made after the first
  // call's activations are gone, as without a cache, so that hits never
  // raise the extraction's peak; where every slice runs in one call, that
  // call's maps.
  torch::Tensor features;
  const auto make_features = [&] {
    features = torch::empty(
        {total,
         spec.dim * static_cast<int64_t>(spec.layers.size()),
         a / spec.patch,
         b / spec.patch},
        x.options().dtype(dtype));
    for (int64_t i = 0; i < total; ++i) {
      if (kept[i] != nullptr)  // host to device, in stream order
        features[i].copy_(*kept[i], /*non_blocking=*/true);
    }
  };
  if (todo.empty())
    make_features();
  for (int64_t j = 0; j < todo_count; j += chunk) {
    const std::vector<int64_t> idx(
        todo.begin() + j, todo.begin() + std::min(j + chunk, todo_count));
    Dinov3Features f =
        backbone_->forward_features(gather_slices(s, idx), spec.layers);
    const torch::Tensor maps = torch::cat(f.maps, 1).to(dtype);
    f = Dinov3Features{};
    if (!features.defined() && todo_count == total && chunk >= total) {
      features = maps;  // every slice, in one call
    } else {
      if (!features.defined())
        make_features();
      for (size_t k = 0; k < idx.size(); ++k)
        features[idx[k]].copy_(maps[static_cast<int64_t>(k)]);
    }
    for (size_t k = 0; k < idx.size() && !keys.empty(); ++k)
      cache_->store(keys[idx[k]], maps[static_cast<int64_t>(k)]);
  }
  *peak = std::max(*peak, scope.peak());
  return features;
}

torch::Tensor Dinov3Segmenter::segment_slices(
    const torch::Tensor& features, const torch::Tensor& x) {
  const int64_t axis = 2 + opt_.slice_axis;
  const int64_t n = x.size(0), slices = x.size(axis);
  std::vector<int64_t> plane;  // the slice's sides
  for (int64_t d = 2; d < 5; ++d) {
    if (d != axis)
      plane.push_back(x.size(d));
  }
  torch::Tensor logits = head_->forward(features);  // (N S, K, a/16, b/16)
  logits = nn::functional::interpolate(
      logits,
      nn::functional::InterpolateFuncOptions()
          .size(plane)
          .mode(torch::kBilinear)
          .align_corners(false));
  const int64_t k = logits.size(1);
  // (N, S, K, A, B) -> (N, K, S, A, B) -> S back at its axis.
  return logits.reshape({n, slices, k, plane[0], plane[1]})
      .movedim(2, 1)
      .movedim(2, axis);
}

torch::Tensor Dinov3Segmenter::forward(torch::Tensor x) {
  const torch::Tensor origins = std::exchange(origins_, torch::Tensor());
  MT_CHECK(x.dim() == 5, "model.name=dinov3: input ", x.sizes(), " is not 5-D");
  MT_CHECK(
      opt_.context_scale == 0.0,
      "model.name=dinov3 with model.context.scale=",
      opt_.context_scale,
      " needs each patch's context crop as its second input");
  return segment_slices(extract(x, origins, 0, &peak_backbone_), x);
}

torch::Tensor Dinov3Segmenter::forward(torch::Tensor x, torch::Tensor context) {
  if (opt_.context_scale == 0.0 || !context.defined())
    return forward(x);
  const torch::Tensor origins = std::exchange(origins_, torch::Tensor());
  MT_CHECK(
      context.sizes() == x.sizes(),
      "model.name=dinov3: the context crops ",
      context.sizes(),
      " are not the patches' shape ",
      x.sizes());
  torch::Tensor features = extract(x, origins, 0, &peak_backbone_);
  {
    // The context's maps live only until they are fused.
    torch::Tensor around = extract(context, origins, 1, &peak_context_);
    context = torch::Tensor();
    if (opt_.fusion == Fusion::kConcat) {
      features = torch::cat({features, around}, 1);
    } else {
      const torch::Tensor w = fuse_.to(features.scalar_type());
      features = features * w[0].view({1, -1, 1, 1}) +
                 around * w[1].view({1, -1, 1, 1});
    }
  }
  return segment_slices(features, x);
}

int64_t dinov3_slice_bytes(
    const ModelConfig& cfg, int64_t a, int64_t b, bool half) {
  const Dinov3Spec spec = dinov3_spec(cfg.variant);
  return spec.dim * static_cast<int64_t>(spec.layers.size()) *
         (a / spec.patch) * (b / spec.patch) * (half ? 2 : 4);
}

std::shared_ptr<Classifier> make_dinov3(
    const ModelConfig& cfg, const ModelInput& input) {
  const auto& shape = input.sample_shape;  // [C, D, H, W]
  MT_CHECK(shape.size() == 4, "model.name=dinov3 trains on /volumes");
  Dinov3SegOptions opt;
  opt.in_channels = shape[0];
  opt.slices = shape[1 + cfg.slice_axis];
  opt.num_classes = input.num_classes;
  opt.slice_axis = cfg.slice_axis;
  opt.slice_chunk = cfg.slice_chunk;
  opt.context_scale = cfg.context.scale;
  opt.fusion = cfg.context.fusion;
  return std::make_shared<Dinov3Segmenter>(dinov3_spec(cfg.variant), opt);
}

}  // namespace memtrain
