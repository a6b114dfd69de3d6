#pragma once
// model.name=vit: a plain ViT classifier of /images rows. Its body is
// open_clip's VisionTransformer (blocks/vision_transformer.h, under
// "visual", without proj): patches of model.image_patch (16), model.depth
// blocks of width
// model.hidden with heads of 64 channels (one head below 128), the class
// token after ln_post; then a linear head ("head") to the classes. Each
// block is a checkpoint segment ("visual.transformer.resblocks.<i>").
// Its parameter names are open_clip's image tower's, which
// model.pretrained matches by name.

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

// Throws memtrain::Error unless the images are square with a side that is
// a multiple of the patch.
std::shared_ptr<Classifier> make_vit(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
