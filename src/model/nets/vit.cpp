#include "memtrain/model/nets/vit.h"

#include <algorithm>
#include <string>

#include "memtrain/model/blocks/vision_transformer.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

class VitClassifier : public Classifier {
 public:
  VitClassifier(const VisionTransformerSpec& spec, int64_t classes) {
    visual_ =
        register_module("visual", std::make_shared<VisionTransformer>(spec));
    head_ = register_module("head", torch::nn::Linear(spec.width, classes));
    for (int64_t i = 0; i < spec.layers; ++i) {
      segment_names_.push_back(
          "visual.transformer.resblocks." + std::to_string(i));
    }
  }

  using Classifier::forward;
  torch::Tensor forward(torch::Tensor x) override {
    return head_(visual_->forward(x, checkpointed(), recompute()));
  }

 private:
  std::shared_ptr<VisionTransformer> visual_;
  torch::nn::Linear head_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_vit(
    const ModelConfig& cfg, const ModelInput& input) {
  const auto& shape = input.sample_shape;  // [C, H, W]
  const int64_t patch = cfg.image_patch;
  MT_CHECK(
      shape.size() == 3 && shape[1] == shape[2] && shape[1] % patch == 0,
      "model.name=vit: the images must be square with a side that is a "
      "multiple of model.image_patch=",
      patch,
      ", got ",
      shape.size() == 3
          ? std::to_string(shape[1]) + " x " + std::to_string(shape[2])
          : std::string("another shape"),
      "; convert with --size 224");
  VisionTransformerSpec spec;
  spec.in_channels = shape[0];
  spec.image_size = shape[1];
  spec.patch_size = patch;
  spec.width = cfg.hidden;
  spec.layers = cfg.depth;
  spec.heads = std::max<int64_t>(1, cfg.hidden / 64);
  MT_CHECK(
      cfg.hidden < 128 || cfg.hidden % 64 == 0,
      "model.name=vit: model.hidden=",
      cfg.hidden,
      " must be a multiple of 64 (heads of 64 channels) or below 128");
  return std::make_shared<VitClassifier>(spec, input.num_classes);
}

}  // namespace memtrain
