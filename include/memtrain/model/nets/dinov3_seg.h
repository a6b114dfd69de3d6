#pragma once
// model.name=dinov3: 3D volumes segmented slice by slice by a frozen DINOv3
// ViT (blocks/dinov3_vit.h, under "backbone") whose patch features feed a
// trained head ("head"). A patch (N, C, D, H, W) is cut into 2D slices
// across model.slice_axis (C = 1 is repeated to the backbone's 3
// channels); the backbone runs on them without gradient, model.slice_chunk
// slices at a time, each keeping only the normed patch maps of its feature
// layers (Meta's four even intervals), concatenated along channels. With
// model.context.scale the same backbone runs on the patch's context crop
// (input/context_crop.h, the second input) and the two feature maps are
// fused (model.context.fusion: concat, or a sum with two learned weights
// per channel, "fuse"), the context's released as soon as fused. The
// head, a 1x1 convolution to the classes (Meta's linear segmentation head
// without its batch-norm: memtrain keeps updates independent of the
// micro-batch split), is upsampled bilinearly (align_corners false) to the
// slice and the slices stacked back: voxel logits (N, K, D, H, W). Only the
// head (and "fuse") trains: the backbone's parameters need no gradient
// from the start, so they are outside the optimizer, the gradient buckets
// and the all-reduce. No checkpoint segments: the backbone keeps no
// activations. Each extraction's device peak is measured on its own
// (take_phase_peaks: the window record's mem_peak_backbone and
// mem_peak_context). With a feature cache (model.feature_cache=host) the
// maps of slices whose origins it holds are copied back instead of
// extracted (Note [The feature cache]).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/model/models.h"

namespace memtrain {

struct Dinov3SegOptions {
  int64_t in_channels = 1;
  int64_t slices = 1;  // a training patch's, across slice_axis
  int64_t num_classes = 2;
  int64_t slice_axis = 0;
  int64_t slice_chunk = 0;     // 0: every slice of a call at once
  double context_scale = 0.0;  // 0: no context input
  Fusion fusion = Fusion::kConcat;
};

class Dinov3Segmenter : public Classifier {
 public:
  Dinov3Segmenter(const Dinov3Spec& spec, const Dinov3SegOptions& opt);
  // Without context (model.context.scale 0).
  torch::Tensor forward(torch::Tensor x) override;
  // `context`: the context crops of `x`, its shape (model.context.scale).
  torch::Tensor forward(torch::Tensor x, torch::Tensor context) override;
  // The backbone stays in evaluation mode.
  void train(bool on = true) override;
  std::vector<std::pair<std::string, int64_t>> take_phase_peaks() override;
  Dinov3Vit& backbone() {
    return *backbone_;
  }
  // Slices per backbone call (0: all of a call's at once); the planner's
  // knob under a budget (model.slice_chunk auto).
  int64_t chunk_units(int64_t micro) const override {
    return micro * opt_.slices;
  }
  void set_chunk(int64_t units) override {
    opt_.slice_chunk = units;
  }
  void set_origins(const torch::Tensor& origins) override {
    origins_ = origins;
  }
  void set_feature_cache(std::shared_ptr<FeatureCache> cache) override {
    cache_ = std::move(cache);
  }

 private:
  // The backbone's maps of `x`'s slices, (N S, L D, a/16, b/16), no graph,
  // through the feature cache where `origins` are defined (`view`: 0 the
  // patches, 1 their context crops); folds the extraction's device peak
  // into *peak.
  torch::Tensor extract(
      const torch::Tensor& x,
      const torch::Tensor& origins,
      int64_t view,
      int64_t* peak);
  torch::Tensor segment_slices(
      const torch::Tensor& features, const torch::Tensor& x);

  Dinov3SegOptions opt_;
  std::shared_ptr<Dinov3Vit> backbone_;
  torch::Tensor fuse_;  // (2, L D): fusion add's weights
  torch::nn::Conv2d head_{nullptr};
  int64_t peak_backbone_ = -1, peak_context_ = -1;  // -1: none since taken
  torch::Tensor origins_;  // the next forward's, consumed by it
  std::shared_ptr<FeatureCache> cache_;
};

// The bytes one slice's maps take (every feature layer's, the model's
// features) for slices of sides `a` x `b`: float32, or 16-bit under AMP
// (`half`). What model.feature_cache keeps per slice and view.
int64_t dinov3_slice_bytes(
    const ModelConfig& cfg, int64_t a, int64_t b, bool half);

// The segmenter of model.variant (auto: vits16) for volumes of
// input.sample_shape [C, D, H, W]. Throws memtrain::Error for C other
// than 1 or 3 and slice sides that are not multiples of 16.
std::shared_ptr<Classifier> make_dinov3(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
