#pragma once
// model.name=dinov3: 3D volumes segmented slice by slice by a frozen DINOv3
// ViT (blocks/dinov3_vit.h, under "backbone") whose patch features feed a
// trained head ("head"). A patch (N, C, D, H, W) is cut into 2D slices
// across model.slice_axis (C = 1 is repeated to the backbone's 3
// channels); the backbone runs on them without gradient, model.slice_chunk
// slices at a time, each keeping only the normed patch maps of its feature
// layers (Meta's four even intervals), concatenated along channels; the
// head, a 1x1 convolution to the classes (Meta's linear segmentation head
// without its batch-norm: memtrain keeps updates independent of the
// micro-batch split), is upsampled bilinearly (align_corners false) to the
// slice and the slices stacked back: voxel logits (N, K, D, H, W). Only the
// head trains: the backbone's parameters need no gradient from the start,
// so they are outside the optimizer, the gradient buckets and the
// all-reduce. No checkpoint segments: the backbone keeps no activations.

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/model/models.h"

namespace memtrain {

class Dinov3Segmenter : public Classifier {
 public:
  Dinov3Segmenter(
      const Dinov3Spec& spec,
      int64_t in_channels,
      int64_t num_classes,
      int64_t slice_axis,
      int64_t slice_chunk);
  torch::Tensor forward(torch::Tensor x) override;
  // The backbone stays in evaluation mode.
  void train(bool on = true) override;
  Dinov3Vit& backbone() {
    return *backbone_;
  }
  // Slices per backbone call (0: all of a micro-batch's at once).
  void set_slice_chunk(int64_t chunk) {
    slice_chunk_ = chunk;
  }

 private:
  int64_t slice_axis_, slice_chunk_;
  std::shared_ptr<Dinov3Vit> backbone_;
  torch::nn::Conv2d head_{nullptr};
};

// The segmenter of model.variant (auto: vits16) for volumes of
// input.sample_shape [C, D, H, W]. Throws memtrain::Error for C other
// than 1 or 3 and slice sides that are not multiples of 16.
std::shared_ptr<Classifier> make_dinov3(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
