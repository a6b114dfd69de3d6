#include "memtrain/model/models.h"

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// Largest group count <= 8 that divides `channels`.
int64_t groups_for(int64_t channels) {
  for (int64_t g = 8; g > 1; --g) {
    if (channels % g == 0)
      return g;
  }
  return 1;
}

class FeatureMlp : public Classifier {
 public:
  FeatureMlp(int64_t in, int64_t hidden, int64_t classes, bool norm) {
    fc1_ = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2_ = register_module("fc2", torch::nn::Linear(hidden, hidden));
    head_ = register_module("head", torch::nn::Linear(hidden, classes));
    if (norm) {
      const int64_t g = groups_for(hidden);
      norm1_ = register_module(
          "norm1",
          torch::nn::GroupNorm(torch::nn::GroupNormOptions(g, hidden)));
      norm2_ = register_module(
          "norm2",
          torch::nn::GroupNorm(torch::nn::GroupNormOptions(g, hidden)));
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = fc1_(x);
    if (norm1_)
      x = norm1_(x);
    x = torch::relu(x);
    x = fc2_(x);
    if (norm2_)
      x = norm2_(x);
    x = torch::relu(x);
    return head_(x);
  }

 private:
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, head_{nullptr};
  torch::nn::GroupNorm norm1_{nullptr}, norm2_{nullptr};
};

class SmallCnn : public Classifier {
 public:
  SmallCnn(int64_t in_channels, int64_t width, int64_t classes, bool norm) {
    using torch::nn::Conv2dOptions;
    conv1_ = register_module(
        "conv1",
        torch::nn::Conv2d(Conv2dOptions(in_channels, width, 3).padding(1)));
    conv2_ = register_module(
        "conv2",
        torch::nn::Conv2d(Conv2dOptions(width, 2 * width, 3).padding(1)));
    head_ = register_module("head", torch::nn::Linear(2 * width, classes));
    if (norm) {
      norm1_ = register_module(
          "norm1",
          torch::nn::GroupNorm(
              torch::nn::GroupNormOptions(groups_for(width), width)));
      norm2_ = register_module(
          "norm2",
          torch::nn::GroupNorm(
              torch::nn::GroupNormOptions(groups_for(2 * width), 2 * width)));
    }
  }

  torch::Tensor forward(torch::Tensor x) override {
    x = conv1_(x);
    if (norm1_)
      x = norm1_(x);
    x = torch::max_pool2d(torch::relu(x), 2);
    x = conv2_(x);
    if (norm2_)
      x = norm2_(x);
    x = torch::relu(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return head_(x);
  }

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::Linear head_{nullptr};
  torch::nn::GroupNorm norm1_{nullptr}, norm2_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_model(
    const ModelConfig& cfg, const ModelInput& input) {
  MT_CHECK(
      input.num_classes >= 2,
      "model: the training data has ",
      input.num_classes,
      " class(es); a classifier needs at least 2 (check /labels)");
  const bool norm = cfg.norm == "group";
  // Initialisation draws from LibTorch's default generator: seed it so that
  // every rank, at every world size, starts from the same parameters.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  if (cfg.name == "mlp") {
    MT_CHECK(
        input.kind == SampleKind::kFeatures,
        "model.name=mlp needs a /features file, but data.train holds ",
        to_string(input.kind),
        "; use model.name=cnn for images");
    return std::make_shared<FeatureMlp>(
        input.sample_shape.at(0), cfg.hidden, input.num_classes, norm);
  }
  if (cfg.name == "cnn") {
    MT_CHECK(
        input.kind == SampleKind::kImages,
        "model.name=cnn needs an /images file, but data.train holds ",
        to_string(input.kind),
        "; use model.name=mlp for features");
    MT_CHECK(
        input.sample_shape.at(1) >= 2 && input.sample_shape.at(2) >= 2,
        "model.name=cnn needs images of at least 2x2 pixels");
    return std::make_shared<SmallCnn>(
        input.sample_shape.at(0), cfg.hidden, input.num_classes, norm);
  }
  throw InternalError(
      "make_model: unknown model '" + cfg.name + "' passed config validation");
}

}  // namespace memtrain
