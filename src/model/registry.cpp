#include "memtrain/model/registry.h"

#include <sstream>

#include "memtrain/model/nets/clip.h"
#include "memtrain/model/nets/dinov3_seg.h"
#include "memtrain/model/nets/dual_encoder.h"
#include "memtrain/model/nets/mlp.h"
#include "memtrain/model/nets/resnet.h"
#include "memtrain/model/nets/small_cnn.h"
#include "memtrain/model/nets/swin_unetr.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/model/nets/vit.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// --- factories of one signature ----------------------------------------------

std::shared_ptr<Classifier> resnet(const ModelConfig& c, const ModelInput& in) {
  return make_resnet(c, in.sample_shape.at(0), in.num_classes);
}
std::shared_ptr<Classifier> unet3d(const ModelConfig& c, const ModelInput& in) {
  return make_unet3d(c, in.sample_shape.at(0), in.num_classes);
}
std::shared_ptr<Classifier> swin_unetr(
    const ModelConfig& c, const ModelInput& in) {
  return make_swin_unetr(c, in.sample_shape.at(0), in.num_classes);
}
std::shared_ptr<PairEncoder> dual_encoder(
    const ModelConfig& c, const ModelInput& in) {
  return make_dual_encoder(c, in);
}
std::shared_ptr<PairEncoder> clip(const ModelConfig& c, const ModelInput& in) {
  return make_clip(c, in);
}

// --- the banner's words ------------------------------------------------------

std::string width_depth_norm(const ModelConfig& c, const BannerFacts& f) {
  std::ostringstream out;
  out << f.width << ", depth " << c.depth << ", norm " << c.norm;
  return out.str();
}
std::string batch_norm_buffers(const ModelConfig&, const BannerFacts& f) {
  return std::to_string(f.buffers) + " buffers (batch-norm statistics)";
}
std::string swin_words(const ModelConfig&, const BannerFacts& f) {
  return f.width + ", instance norm as MONAI's, " + std::to_string(f.buffers) +
         " buffers (relative position indices)";
}
std::string vit_words(const ModelConfig& c, const BannerFacts&) {
  return "width " + std::to_string(c.hidden) + ", depth " +
         std::to_string(c.depth) + ", patches " + std::to_string(c.image_patch);
}
std::string clip_words(const ModelConfig& c, const BannerFacts&) {
  return clip_spec(c.variant).variant +
         ", open_clip's ViT and text transformer";
}
std::string dinov3_words(const ModelConfig& c, const BannerFacts&) {
  return dinov3_spec(c.variant).variant +
         ", Meta's DINOv3 ViT (frozen) on slices across axis " +
         std::to_string(c.slice_axis) +
         (c.context.scale > 0
              ? detail::concat(
                    ", context x", c.context.scale, " (", c.context.fusion, ")")
              : std::string()) +
         ", a trained head";
}

// --- the rows, in ModelName's order
// -------------------------------------------

std::vector<ModelRow> make_rows() {
  std::vector<ModelRow> rows;
  ModelRow r;

  r = ModelRow{};  // residual MLP on /features (nets/mlp.h)
  r.name = ModelName::kMlp;
  r.trains_on = kOnFeatures;
  r.make = make_mlp;
  r.words = width_depth_norm;
  rows.push_back(r);

  r = ModelRow{};  // small CNN on /images (nets/small_cnn.h)
  r.name = ModelName::kCnn;
  r.trains_on = kOnImages;
  r.conv2d = true;
  r.make = make_small_cnn;
  r.words = width_depth_norm;
  rows.push_back(r);

  r = ModelRow{};  // timm's resnet50 (nets/resnet.h)
  r.name = ModelName::kResnet50;
  r.trains_on = kOnImages;
  r.batch_norm = r.conv2d = r.imagenet_images = true;
  r.make = resnet;
  r.words = batch_norm_buffers;
  rows.push_back(r);

  r.name = ModelName::kSeresnext50;  // timm's seresnext50_32x4d: the same row
  rows.push_back(r);

  r = ModelRow{};  // residual 3D U-Net (nets/unet3d.h)
  r.name = ModelName::kUnet3d;
  r.trains_on = kOnVolumes;
  r.instance_norm = true;
  r.feature_size = 16;
  r.make = unet3d;
  r.words = width_depth_norm;
  rows.push_back(r);

  r = ModelRow{};  // two towers on pairs (nets/dual_encoder.h)
  r.name = ModelName::kDualEncoder;
  r.trains_on = kOnPairs;
  r.make_pair = dual_encoder;
  r.words = width_depth_norm;
  rows.push_back(r);

  r = ModelRow{};  // MONAI's SwinUNETR (nets/swin_unetr.h)
  r.name = ModelName::kSwinUnetr;
  r.trains_on = kOnVolumes;
  r.instance_norm = true;
  r.refuses_group_norm =
      "normalises as MONAI's SwinUNETR (instance norm in its convolution "
      "blocks, layer norm in its transformer); model.norm=group is unet3d's "
      "(set model.norm=none or instance)";
  r.feature_size = 48;
  r.make = swin_unetr;
  r.words = swin_words;
  rows.push_back(r);

  r = ModelRow{};  // open_clip's ViT and text transformer (nets/clip.h)
  r.name = ModelName::kClip;
  r.trains_on = kOnTokenPairs;
  r.clip_images = true;
  r.make_pair = clip;
  r.words = clip_words;
  rows.push_back(r);

  r = ModelRow{};  // a plain ViT on /images (nets/vit.h)
  r.name = ModelName::kVit;
  r.trains_on = kOnImages;
  r.refuses_group_norm =
      "normalises with layer norms only (open_clip's image tower); "
      "model.norm=group is unet3d's (set model.norm=none)";
  r.make = make_vit;
  r.words = vit_words;
  rows.push_back(r);

  r = ModelRow{};  // Meta's DINOv3 ViT, frozen, on slices (nets/dinov3_seg.h)
  r.name = ModelName::kDinov3;
  r.trains_on = kOnVolumes;
  r.refuses_group_norm =
      "normalises with its frozen backbone's layer norms only (Meta's "
      "DINOv3); model.norm=group is unet3d's (set model.norm=none)";
  r.context_crops = true;
  r.feature_cache = true;
  r.make = make_dinov3;
  r.words = dinov3_words;
  rows.push_back(r);

  for (size_t i = 0; i < rows.size(); ++i) {
    MT_INTERNAL_ASSERT(
        static_cast<size_t>(rows[i].name) == i &&
            (rows[i].make != nullptr) != (rows[i].make_pair != nullptr),
        "model row ",
        i,
        " (",
        rows[i].name,
        ") out of ModelName's order or without exactly one factory");
  }
  MT_INTERNAL_ASSERT(
      rows.size() == choice_names(ModelName{}).size(),
      "a ModelName without a row in model/registry.cpp");
  return rows;
}

// "a", "a or b", "a, b or c".
std::string or_list(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  }
  return out;
}

// "a, b, c".
std::string comma_list(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names)
    out += (out.empty() ? "" : ", ") + n;
  return out;
}

// The models whose row says `has`, by name.
template <class F>
std::vector<std::string> names_where(F has) {
  std::vector<std::string> out;
  for (const ModelRow& r : model_rows()) {
    if (has(r))
      out.push_back(to_string(r.name));
  }
  return out;
}

// Each input with the models that train on it, as messages list them:
// "mlp: /features, cnn, resnet50 or seresnext50_32x4d: /images, ...".
std::string inputs_of_models() {
  const std::pair<unsigned, const char*> inputs[] = {
      {kOnFeatures, "/features"},
      {kOnImages, "/images"},
      {kOnVolumes, "/volumes"},
      {kOnPairs, "pairs of /features_a or /images with /features_b"},
      {kOnTokenPairs, "pairs of /images and /tokens"}};
  std::string out;
  for (const auto& [bit, words] : inputs) {
    const auto names = names_where(
        [bit = bit](const ModelRow& r) { return r.trains_on & bit; });
    out += (out.empty() ? "" : ", ") + or_list(names) + ": " + words;
  }
  return out;
}

}  // namespace

const std::vector<ModelRow>& model_rows() {
  static const std::vector<ModelRow> rows = make_rows();
  return rows;
}

const ModelRow& model_row(ModelName name) {
  return model_rows().at(static_cast<size_t>(name));
}

bool trains_on(ModelName name, unsigned what) {
  return (model_row(name).trains_on & what) != 0;
}

std::string models_on(unsigned what) {
  return or_list(
      names_where([what](const ModelRow& r) { return r.trains_on & what; }));
}

std::string models_with(bool ModelRow::*trait) {
  return comma_list(
      names_where([trait](const ModelRow& r) { return r.*trait; }));
}

void check_model_config(const TrainConfig& cfg) {
  const ModelConfig& model = cfg.model;
  const ModelRow& row = model_row(model.name);
  MT_CHECK(
      !(row.trains_on & (kOnPairs | kOnTokenPairs)) ||
          cfg.data.episodes.n_way == 0,
      "config: model.name=",
      model.name,
      " trains on pairs, not episodes; set data.episodes.n_way=0 and "
      "model.head=linear");
  MT_CHECK(
      !model.sync_bn || row.batch_norm,
      "config: model.sync_bn: true needs a model with batch-norm (",
      models_with(&ModelRow::batch_norm),
      "); model.name=",
      model.name,
      " has none");
  if (model.norm == Norm::kInstance && !row.instance_norm) {
    std::string owners;
    for (const std::string& n :
         names_where([](const ModelRow& r) { return r.instance_norm; })) {
      owners += (owners.empty() ? "" : " and ") + n + "'s";
    }
    throw Error(detail::concat(
        "config: model.norm=instance is ",
        owners,
        "; model.name=",
        model.name,
        row.refuses_group_norm || row.batch_norm
            ? " has none (set model.norm=none)"
            : " has none or group (set model.norm=none or group)"));
  }
  MT_CHECK(
      model.norm != Norm::kGroup || row.refuses_group_norm == nullptr,
      "config: model.name=",
      model.name,
      " ",
      row.refuses_group_norm ? row.refuses_group_norm : "");
  MT_CHECK(
      model.norm == Norm::kNone || !row.batch_norm,
      "config: model.name=",
      model.name,
      " normalises with timm's batch-norm, so model.norm=",
      model.norm,
      " would be ignored; set model.norm=none");
  MT_CHECK(
      model.channels_last != Switch::kOn || row.conv2d,
      "config: model.channels_last=on is for the 2D convolutional models (",
      models_with(&ModelRow::conv2d),
      "); model.name=",
      model.name,
      " has none: set model.channels_last=auto or off");
  const double scale = model.context.scale;
  MT_CHECK(
      scale == 0.0 || row.context_crops,
      "config: model.context.scale=",
      scale,
      " is for the models that take a context crop (",
      models_with(&ModelRow::context_crops),
      "); model.name=",
      model.name,
      " takes none: set model.context.scale=0");
  MT_CHECK(
      model.feature_cache == FeatureCacheMode::kNone || row.feature_cache,
      "config: model.feature_cache=",
      model.feature_cache,
      " is for the models with a frozen extraction (",
      models_with(&ModelRow::feature_cache),
      "); model.name=",
      model.name,
      " has none: set model.feature_cache=none");
  MT_CHECK(
      scale == 0.0 || scale > 1.0,
      "config: model.context.scale=",
      scale,
      ": the context crop must be larger than the patch (> 1, e.g. 2), "
      "or 0 for no context");
}

int64_t model_feature_size(const ModelConfig& m) {
  return m.feature_size != 0 ? m.feature_size : model_row(m.name).feature_size;
}

void check_model_fits(
    ModelName model, SampleKind kind, bool paired, const std::string& source) {
  const unsigned what = paired ? (kOnPairs | kOnTokenPairs)
                        : kind == SampleKind::kFeatures ? kOnFeatures
                        : kind == SampleKind::kImages   ? kOnImages
                                                        : kOnVolumes;
  if (trains_on(model, what))
    return;  // clip's factory checks /images and /tokens
  ModelName fits = model;
  for (const ModelRow& r : model_rows()) {
    if (r.trains_on & what) {
      fits = r.name;
      break;
    }
  }
  throw Error(detail::concat(
      "model.name=",
      model,
      " cannot train on ",
      paired ? "pairs" : to_string(kind),
      " (",
      source,
      "); use model.name=",
      fits,
      " (",
      inputs_of_models(),
      ")"));
}

std::shared_ptr<Classifier> make_model(
    const ModelConfig& cfg, const ModelInput& input) {
  // One output is a binary classifier's logit (model.num_classes=1).
  MT_CHECK(
      input.num_classes >= 2 ||
          (input.num_classes == 1 && cfg.num_classes == 1),
      "model: the training data has ",
      input.num_classes,
      " class(es); a classifier needs at least 2 (check /labels)");
  check_model_fits(cfg.name, input.kind, false, "data.train");
  const ModelRow& row = model_row(cfg.name);
  MT_INTERNAL_ASSERT(row.make, "make_model: model.name=", cfg.name);
  // Initialisation draws from LibTorch's default generator: seed it so that
  // every rank, at every world size, starts from the same parameters.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  return row.make(cfg, input);
}

std::shared_ptr<PairEncoder> make_pair_encoder(
    const ModelConfig& cfg, const ModelInput& input) {
  const ModelRow& row = model_row(cfg.name);
  MT_INTERNAL_ASSERT(row.make_pair, "make_pair_encoder: model.name=", cfg.name);
  return row.make_pair(cfg, input);
}

std::string model_words(const ModelConfig& cfg, const BannerFacts& facts) {
  return model_row(cfg.name).words(cfg, facts);
}

}  // namespace memtrain
