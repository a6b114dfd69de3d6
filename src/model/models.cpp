#include "memtrain/model/models.h"

#include <algorithm>

#include "memtrain/model/checkpointed.h"
#include "memtrain/model/resnet.h"
#include "memtrain/model/swin_unetr.h"
#include "memtrain/model/unet3d.h"
#include "memtrain/util/error.h"

namespace memtrain {

torch::Tensor Classifier::forward(torch::Tensor x) {
  return body(stem(x));
}

torch::Tensor Classifier::body(torch::Tensor x) {
  for (int64_t i = 0; i < num_segments(); ++i) {
    if (i < checkpointed_) {
      x = checkpoint(
          [this, i](const at::Tensor& t) { return segment(i, t); },
          x,
          recompute_);
    } else {
      x = segment(i, x);
    }
  }
  return head(x);
}

torch::Tensor Classifier::forward(torch::Tensor x, torch::Tensor context) {
  throw InternalError("this model takes no context features");
}

torch::Tensor Classifier::stem(torch::Tensor x) {
  throw InternalError("stem(): not a sequential model");
}
torch::Tensor Classifier::segment(int64_t i, torch::Tensor x) {
  throw InternalError("segment(): not a sequential model");
}
torch::Tensor Classifier::head(torch::Tensor x) {
  throw InternalError("head(): not a sequential model");
}

void Classifier::set_checkpointed(int64_t count) {
  MT_INTERNAL_ASSERT(count >= 0 && count <= num_segments());
  checkpointed_ = count;
}

void Classifier::set_batch_norm_sync(
    BatchNormSync sync, const std::string& model) {
  MT_CHECK(
      !sync || has_batch_norm(),
      "model.sync_bn: true needs a model with batch-norm (resnet50, "
      "seresnext50_32x4d); model.name=",
      model,
      " has none");
  batch_norm_sync_ = std::move(sync);
}

void Classifier::to_channels_last() {
  torch::NoGradGuard no_grad;
  for (auto& t : parameters()) {
    if (t.dim() == 4)
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
  }
  for (auto& t : buffers()) {
    if (t.dim() == 4)
      t.set_data(t.contiguous(at::MemoryFormat::ChannelsLast));
  }
  channels_last_ = true;
}

int64_t groups_for(int64_t channels) {
  for (int64_t g = 8; g > 1; --g) {
    if (channels % g == 0)
      return g;
  }
  return 1;
}

namespace {

// x + fc2(dropout(relu(norm(fc1(x))))), widening 4x inside: most of a
// block's activations are the wide ones, which checkpointing drops.
struct MlpBlockImpl : torch::nn::Module {
  MlpBlockImpl(int64_t width, bool norm, double dropout) : dropout_(dropout) {
    fc1 = register_module("fc1", torch::nn::Linear(width, 4 * width));
    fc2 = register_module("fc2", torch::nn::Linear(4 * width, width));
    if (norm) {
      norm1 = register_module(
          "norm",
          torch::nn::GroupNorm(
              torch::nn::GroupNormOptions(groups_for(4 * width), 4 * width)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = fc1(x);
    if (norm1)
      h = norm1(h.to(torch::kFloat32));  // norms run in fp32 under autocast
    h = torch::relu(h);
    if (dropout_ > 0)
      h = torch::dropout(h, dropout_, is_training());
    return x + fc2(h);
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::GroupNorm norm1{nullptr};
  double dropout_;
};
TORCH_MODULE(MlpBlock);

class FeatureMlp : public Classifier {
 public:
  // `context` > 0: a second input (/context_features, F2 wide) fused with
  // the first at the stem: relu(input(x) + context(c)).
  FeatureMlp(
      int64_t in, int64_t context, const ModelConfig& cfg, int64_t classes) {
    const bool norm = cfg.norm == Norm::kGroup;  // instance: unet3d only
    input_ = register_module("input", torch::nn::Linear(in, cfg.hidden));
    if (context > 0) {
      context_ =
          register_module("context", torch::nn::Linear(context, cfg.hidden));
    }
    blocks_ = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < cfg.depth; ++i) {
      blocks_->push_back(MlpBlock(cfg.hidden, norm, cfg.dropout));
      segment_names_.push_back("blocks." + std::to_string(i));
    }
    head_ = register_module("head", torch::nn::Linear(cfg.hidden, classes));
  }

 public:
  using Classifier::forward;
  torch::Tensor forward(torch::Tensor x, torch::Tensor c) override {
    MT_CHECK(
        !context_.is_empty(),
        "this model was built without context features; the data has "
        "/context_features but the model was not sized for them");
    return body(torch::relu(input_(x) + context_(c)));
  }

 protected:
  torch::Tensor stem(torch::Tensor x) override {
    MT_CHECK(
        context_.is_empty(),
        "the model fuses /context_features: call forward(x, context)");
    return torch::relu(input_(x));
  }
  torch::Tensor segment(int64_t i, torch::Tensor x) override {
    return blocks_[i]->as<MlpBlockImpl>()->forward(x);
  }
  torch::Tensor head(torch::Tensor x) override {
    return head_(x);
  }

 private:
  torch::nn::Linear input_{nullptr}, context_{nullptr}, head_{nullptr};
  torch::nn::ModuleList blocks_{nullptr};
};

// conv3x3 -> [group norm] -> relu -> 2x2 max-pool (while the image allows).
struct ConvStageImpl : torch::nn::Module {
  ConvStageImpl(int64_t in, int64_t out, bool norm, bool pool) : pool_(pool) {
    conv = register_module(
        "conv",
        torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1)));
    if (norm) {
      norm1 = register_module(
          "norm",
          torch::nn::GroupNorm(
              torch::nn::GroupNormOptions(groups_for(out), out)));
    }
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor h = kept_conv(conv, x);
    if (norm1)
      h = norm1(h.to(torch::kFloat32));  // norms run in fp32 under autocast
    h = torch::relu(h);
    return pool_ ? torch::max_pool2d(h, 2) : h;
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::GroupNorm norm1{nullptr};
  bool pool_;
};
TORCH_MODULE(ConvStage);

class SmallCnn : public Classifier {
 public:
  SmallCnn(
      const std::vector<int64_t>& shape,
      const ModelConfig& cfg,
      int64_t classes) {
    const bool norm = cfg.norm == Norm::kGroup;  // instance: unet3d only
    const int64_t width = cfg.hidden;
    stem_ = register_module(
        "stem",
        torch::nn::Conv2d(
            torch::nn::Conv2dOptions(shape[0], width, 3).padding(1)));
    stages_ = register_module("stages", torch::nn::ModuleList());
    int64_t channels = width;
    int64_t h = shape[1], w = shape[2];
    for (int64_t i = 0; i < cfg.depth; ++i) {
      const bool pool = h >= 2 && w >= 2;
      stages_->push_back(ConvStage(channels, 2 * channels, norm, pool));
      segment_names_.push_back("stages." + std::to_string(i));
      channels *= 2;
      if (pool) {
        h /= 2;
        w /= 2;
      }
    }
    head_ = register_module("head", torch::nn::Linear(channels, classes));
  }

 protected:
  torch::Tensor stem(torch::Tensor x) override {
    return torch::relu(stem_(x));
  }
  torch::Tensor segment(int64_t i, torch::Tensor x) override {
    return stages_[i]->as<ConvStageImpl>()->forward(x);
  }
  torch::Tensor head(torch::Tensor x) override {
    return head_(torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1));
  }

 private:
  torch::nn::Conv2d stem_{nullptr};
  torch::nn::ModuleList stages_{nullptr};
  torch::nn::Linear head_{nullptr};
};

}  // namespace

int64_t model_num_classes(
    const ModelConfig& cfg, const DatasetInfo& ti, bool binary) {
  const int64_t asked = cfg.num_classes;
  MT_CHECK(
      binary || asked == 0 || asked >= ti.num_classes,
      "model.num_classes=",
      asked,
      " but data.train '",
      ti.path,
      "' has labels up to ",
      ti.num_classes - 1,
      " (",
      ti.num_classes,
      " classes); set model.num_classes to at least ",
      ti.num_classes,
      " or 0 (from the data)");
  return binary ? 1 : std::max(ti.num_classes, asked);
}

void check_model_fits(
    ModelName model, SampleKind kind, bool paired, const std::string& source) {
  if (paired && model == ModelName::kClip)
    return;  // make_clip checks /images and /tokens
  const ModelName fits = paired ? ModelName::kDualEncoder
                         : kind == SampleKind::kFeatures ? ModelName::kMlp
                         : kind == SampleKind::kImages   ? ModelName::kCnn
                                                         : ModelName::kUnet3d;
  const bool image_model = model == ModelName::kCnn || is_resnet(model);
  MT_CHECK(
      model == fits ||
          (!paired && kind == SampleKind::kImages && image_model) ||
          (!paired && kind == SampleKind::kVolumes && is_volume_model(model)),
      "model.name=",
      model,
      " cannot train on ",
      paired ? "pairs" : to_string(kind),
      " (",
      source,
      "); use model.name=",
      fits,
      " (mlp: /features, cnn, resnet50 or seresnext50_32x4d: /images, "
      "unet3d or swin_unetr: /volumes, dual_encoder: pairs of /features_a "
      "or /images with /features_b, clip: pairs of /images and /tokens)");
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
  // Initialisation draws from LibTorch's default generator: seed it so that
  // every rank, at every world size, starts from the same parameters.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  switch (cfg.name) {
    case ModelName::kMlp:
      return std::make_shared<FeatureMlp>(
          input.sample_shape.at(0),
          input.context_features,
          cfg,
          input.num_classes);
    case ModelName::kCnn:
      return std::make_shared<SmallCnn>(
          input.sample_shape, cfg, input.num_classes);
    case ModelName::kResnet50:
    case ModelName::kSeresnext50:
      return make_resnet(cfg, input.sample_shape.at(0), input.num_classes);
    case ModelName::kUnet3d:
      return make_unet3d(cfg, input.sample_shape.at(0), input.num_classes);
    case ModelName::kSwinUnetr:
      return make_swin_unetr(cfg, input.sample_shape.at(0), input.num_classes);
    case ModelName::kDualEncoder:
    case ModelName::kClip:
      break;  // refused by check_model_fits: they train on pairs
  }
  MT_INTERNAL_ASSERT(false, "make_model: model.name=", cfg.name);
  return nullptr;
}

}  // namespace memtrain
