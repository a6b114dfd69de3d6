#include "memtrain/model/nets/small_cnn.h"

#include "memtrain/model/blocks/checkpointed.h"

namespace memtrain {
namespace {

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

std::shared_ptr<Classifier> make_small_cnn(
    const ModelConfig& cfg, const ModelInput& input) {
  return std::make_shared<SmallCnn>(input.sample_shape, cfg, input.num_classes);
}

}  // namespace memtrain
