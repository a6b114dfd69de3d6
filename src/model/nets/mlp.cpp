#include "memtrain/model/nets/mlp.h"

#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// x + fc2(dropout(relu(norm(fc1(x))))), widening 4x inside: most of a
// block's activations are the wide ones, which checkpointing drops; a
// selective checkpoint keeps the two linears' outputs and recomputes the
// norm, the activation and the dropout (its mask from the saved RNG).
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
    torch::Tensor h = kept_linear(fc1, x);
    if (norm1)
      h = norm1(h.to(torch::kFloat32));  // norms run in fp32 under autocast
    h = torch::relu(h);
    if (dropout_ > 0)
      h = torch::dropout(h, dropout_, is_training());
    return x + kept_linear(fc2, h);
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

}  // namespace

std::shared_ptr<Classifier> make_mlp(
    const ModelConfig& cfg, const ModelInput& input) {
  return std::make_shared<FeatureMlp>(
      input.sample_shape.at(0), input.context_features, cfg, input.num_classes);
}

}  // namespace memtrain
