#pragma once
// The model registry: one row per model.name (kRows in registry.cpp) --
// what the model trains on, the traits the config's model rules and the
// input pipeline ask, its factory and the banner's words. Code outside
// src/model/ never tests a model name; it asks the row. A new model: its
// files under nets/, its row in registry.cpp, its spelling in
// config/choices.h (ModelName), its line in CMakeLists.txt.

#include <memory>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

class PairEncoder;

// What a model trains on: bits of ModelRow::trains_on.
enum TrainsOn : unsigned {
  kOnFeatures = 1u << 0,    // rows of /features
  kOnImages = 1u << 1,      // rows of /images
  kOnVolumes = 1u << 2,     // patches of /volumes
  kOnPairs = 1u << 3,       // pairs: /features_a or /images with /features_b
  kOnTokenPairs = 1u << 4,  // pairs of /images and /tokens
};

// What the banner's model line says that the config does not.
struct BannerFacts {
  std::string width;  // the task's words for the width ("hidden 256")
  size_t buffers = 0;
};

struct ModelRow {
  ModelName name = ModelName::kMlp;
  unsigned trains_on = 0;  // TrainsOn bits
  // Traits the model rules (check_model_config) and the inputs ask.
  bool batch_norm = false;     // timm's batch-norm: model.sync_bn applies, and
                               // model.norm must be none
  bool conv2d = false;         // 2D convolutions: model.channels_last applies
  bool instance_norm = false;  // model.norm=instance is its
  // Why model.norm=group is refused (nullptr: it is accepted).
  const char* refuses_group_norm = nullptr;
  // data.augment=auto is crop_flip and data.normalize=auto imagenet on
  // 3-channel image rows (timm's ImageNet recipe).
  bool imagenet_images = false;
  // data.normalize=auto is clip on 3-channel images (open_clip's).
  bool clip_images = false;
  // Takes a context crop with each volume patch (model.context applies;
  // its forward(x, context), input/context_crop.h).
  bool context_crops = false;
  // Has a frozen extraction whose outputs model.feature_cache keeps.
  bool feature_cache = false;
  int64_t feature_size = 0;  // model.feature_size=0 (auto) means this
  // The factory of a model of rows or volumes (make_model), or of pairs
  // (make_pair_encoder); the other is nullptr.
  std::shared_ptr<Classifier> (*make)(const ModelConfig&, const ModelInput&) =
      nullptr;
  std::shared_ptr<PairEncoder> (*make_pair)(
      const ModelConfig&, const ModelInput&) = nullptr;
  // The banner's words in the parentheses after model.name.
  std::string (*words)(const ModelConfig&, const BannerFacts&) = nullptr;
};

// The row of `name`; every ModelName has one (a test checks).
const ModelRow& model_row(ModelName name);
// Every row, in ModelName's order.
const std::vector<ModelRow>& model_rows();
// True when model `name` trains on any of the TrainsOn bits `what`.
bool trains_on(ModelName name, unsigned what);

// The models that train on any of `what`, as messages list them
// ("unet3d or swin_unetr").
std::string models_on(unsigned what);

// The models whose row has `trait`, as messages list them ("resnet50,
// seresnext50_32x4d").
std::string models_with(bool ModelRow::*trait);

// The config's rules that depend on the model (model.sync_bn, model.norm,
// model.channels_last, episodes of a pair model), from the row's traits.
// TrainConfig::load checks the rest; the commands call both (cli's
// load_config), and so do set_up_run and trained_on. Throws
// memtrain::Error naming the keys.
void check_model_config(const TrainConfig& cfg);

// model.feature_size resolved: the value given, else the row's (16 for
// unet3d, 48 for swin_unetr: MONAI's BTCV setting).
int64_t model_feature_size(const ModelConfig& m);

// Throws memtrain::Error unless model `model` trains on samples of `kind`
// (or on pairs, `paired`: DatasetInfo::paired); the message names the
// models of each input, from the rows. `source` names the file.
void check_model_fits(
    ModelName model, SampleKind kind, bool paired, const std::string& source);

// Builds `cfg.name` for `input`, initialised from `cfg.seed` alone (the
// same parameters on every rank and at every world size). Throws
// memtrain::Error when the model does not fit the data kind.
std::shared_ptr<Classifier> make_model(
    const ModelConfig& cfg, const ModelInput& input);

// Builds the pair model `cfg.name` (dual_encoder, clip) for `input`.
std::shared_ptr<PairEncoder> make_pair_encoder(
    const ModelConfig& cfg, const ModelInput& input);

// The banner's "model: NAME (WORDS, ...)" words for `cfg`.
std::string model_words(const ModelConfig& cfg, const BannerFacts& facts);

}  // namespace memtrain
