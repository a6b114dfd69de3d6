#include "memtrain/model/nets/resnet.h"

#include <torch/torch.h>

#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/blocks/sync_batch_norm.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

struct Spec {
  int64_t cardinality;
  int64_t base_width;
  bool se;
};

Spec spec_of(ModelName name) {
  if (name == ModelName::kResnet50)
    return {1, 64, false};
  MT_INTERNAL_ASSERT(name == ModelName::kSeresnext50, "not a ResNet: ", name);
  return {32, 4, true};
}

// timm's make_divisible(v, divisor, round_limit=0): the nearest multiple of
// `divisor`, at least `divisor`.
int64_t make_divisible(double v, int64_t divisor) {
  const int64_t n =
      static_cast<int64_t>(v + static_cast<double>(divisor) / 2) / divisor;
  return std::max(divisor, n * divisor);
}

torch::nn::Conv2d conv(
    int64_t in,
    int64_t out,
    int64_t k,
    int64_t stride = 1,
    int64_t groups = 1,
    bool bias = false) {
  return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, k)
                               .stride(stride)
                               .padding(k / 2)
                               .groups(groups)
                               .bias(bias));
}

// Batch-norm in float32 (also under autocast). In training mode it
// normalises with the batch's statistics and, when `update` is set, moves
// the running statistics (momentum 0.1, as PyTorch); a batch-norm whose
// weight is frozen, and every batch-norm in eval mode, normalises with the
// running statistics. With a model.sync_bn hook the batch's statistics are
// those of every rank's concurrent micro-batch (sync_batch_norm.h).
torch::Tensor norm(
    torch::nn::BatchNorm2d& bn,
    const torch::Tensor& x,
    bool update,
    const BatchNormSync& sync) {
  const torch::Tensor h = x.to(torch::kFloat32);
  const auto& o = bn->options;
  if (!bn->is_training() || !bn->weight.requires_grad()) {
    return torch::batch_norm(
        h,
        bn->weight,
        bn->bias,
        bn->running_mean,
        bn->running_var,
        /*training=*/false,
        0.0,
        o.eps(),
        at::globalContext().userEnabledCuDNN());
  }
  if (sync) {
    return sync_batch_norm(
        h,
        bn->weight,
        bn->bias,
        bn->running_mean,
        bn->running_var,
        bn->num_batches_tracked,
        update,
        o.momentum().value_or(0.1),
        o.eps(),
        sync);
  }
  if (update)
    return bn->forward(h);
  return torch::batch_norm(
      h,
      bn->weight,
      bn->bias,
      torch::Tensor(),
      torch::Tensor(),
      /*training=*/true,
      0.0,
      o.eps(),
      at::globalContext().userEnabledCuDNN());
}

// timm's SEModule (its `bn` is an identity, its act a ReLU, its gate a
// sigmoid): parameters fc1.weight, fc1.bias, fc2.weight, fc2.bias.
struct SqueezeExciteImpl : torch::nn::Module {
  explicit SqueezeExciteImpl(int64_t channels) {
    const int64_t rd = make_divisible(static_cast<double>(channels) / 16, 8);
    fc1 = register_module("fc1", conv(channels, rd, 1, 1, 1, true));
    fc2 = register_module("fc2", conv(rd, channels, 1, 1, 1, true));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor s =
        kept_conv(fc2, torch::relu(kept_conv(fc1, x.mean({2, 3}, true))));
    return x * torch::sigmoid(s);
  }
  torch::nn::Conv2d fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(SqueezeExcite);

// timm's Bottleneck; modules registered in timm's order (the state-dict
// order): conv1, bn1, conv2, bn2, conv3, bn3, se, downsample.
struct BottleneckImpl : torch::nn::Module {
  BottleneckImpl(
      int64_t in,
      int64_t planes,
      int64_t stride,
      const Spec& s,
      const BatchNormSync& sync)
      : sync(sync) {
    const int64_t width = planes * s.base_width / 64 * s.cardinality;
    const int64_t out = planes * 4;
    conv1 = register_module("conv1", conv(in, width, 1));
    bn1 = register_module("bn1", torch::nn::BatchNorm2d(width));
    conv2 =
        register_module("conv2", conv(width, width, 3, stride, s.cardinality));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(width));
    conv3 = register_module("conv3", conv(width, out, 1));
    bn3 = register_module("bn3", torch::nn::BatchNorm2d(out));
    if (s.se)
      se = register_module("se", SqueezeExcite(out));
    if (stride != 1 || in != out) {
      ds_conv = conv(in, out, 1, stride);
      ds_bn = torch::nn::BatchNorm2d(out);
      register_module("downsample", torch::nn::Sequential(ds_conv, ds_bn));
    }
  }
  torch::Tensor forward(const torch::Tensor& x, bool update) {
    // The convolutions are what a selective checkpoint keeps.
    torch::Tensor h = torch::relu(norm(bn1, kept_conv(conv1, x), update, sync));
    h = torch::relu(norm(bn2, kept_conv(conv2, h), update, sync));
    h = norm(bn3, kept_conv(conv3, h), update, sync);
    if (se)
      h = se(h);
    const torch::Tensor shortcut =
        ds_conv ? norm(ds_bn, kept_conv(ds_conv, x), update, sync) : x;
    return torch::relu(h + shortcut);
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr}, bn3{nullptr};
  SqueezeExcite se{nullptr};
  torch::nn::Conv2d ds_conv{nullptr};
  torch::nn::BatchNorm2d ds_bn{nullptr};
  const BatchNormSync& sync;  // the ResNet's (model.sync_bn)
};
TORCH_MODULE(Bottleneck);

class ResNet : public Classifier {
 public:
  ResNet(
      const std::string& name,
      const Spec& s,
      int64_t in_channels,
      int64_t classes)
      : name_(name) {
    conv1_ = register_module("conv1", conv(in_channels, 64, 7, 2));
    bn1_ = register_module("bn1", torch::nn::BatchNorm2d(64));
    const int64_t blocks[] = {3, 4, 6, 3};
    int64_t in = 64;
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t planes = int64_t{64} << i;
      auto stage = torch::nn::ModuleList();
      for (int64_t b = 0; b < blocks[i]; ++b) {
        stage->push_back(Bottleneck(
            in, planes, b == 0 && i > 0 ? 2 : 1, s, batch_norm_sync_));
        in = planes * 4;
      }
      const std::string name = "layer" + std::to_string(i + 1);
      stages_.push_back(register_module(name, stage));
      for (int64_t b = 0; b < blocks[i]; ++b)
        segment_names_.push_back(name + "." + std::to_string(b));
    }
    fc_ = register_module("fc", torch::nn::Linear(in, classes));
    initialise();
  }

  using Classifier::forward;
  torch::Tensor forward(torch::Tensor x) override {
    check_batch_norm_values(x);
    x = stem(x);
    int64_t k = 0;  // segment: the bottlenecks in order, layer1.0 first
    for (const auto& stage : stages_) {
      for (const auto& module : *stage) {
        BottleneckImpl* block = module->as<BottleneckImpl>();
        if (k++ < checkpointed()) {
          // checkpoint() runs the block once without grad (the forward: it
          // updates the running statistics) and again with grad in
          // backward (the recomputation: it must not update them a second
          // time).
          x = checkpoint(
              [block](const at::Tensor& t) {
                return block->forward(t, !torch::GradMode::is_enabled());
              },
              x,
              recompute());
        } else {
          x = block->forward(x, true);
        }
      }
    }
    return head(x);
  }

 protected:
  bool has_batch_norm() const override {
    return true;
  }
  torch::Tensor stem(torch::Tensor x) override {
    x = torch::relu(norm(bn1_, conv1_(x), true, batch_norm_sync_));
    return torch::max_pool2d(x, 3, 2, 1);
  }
  torch::Tensor head(torch::Tensor x) override {
    return fc_(x.mean({2, 3}));
  }

 private:
  // Batch-norm in training needs more than one value per channel; layer4
  // sees the input at 1/32 of its size. A clear message instead of
  // LibTorch's, naming what to change. (With model.sync_bn the count is
  // over all ranks, and a rank may run an empty micro-step:
  // sync_batch_norm checks it.)
  void check_batch_norm_values(const torch::Tensor& x) const {
    if (!is_training() || x.dim() != 4 || batch_norm_sync_)
      return;
    auto down = [](int64_t n) { return (n - 1) / 2 + 1; };  // a stride 2
    int64_t h = x.size(2), w = x.size(3);
    for (int i = 0; i < 5; ++i) {  // conv1, max-pool, layer2..layer4
      h = down(h);
      w = down(w);
    }
    MT_CHECK(
        x.size(0) * h * w > 1,
        "model.name=",
        name_,
        ": batch-norm in training needs more than one value per channel, "
        "but a micro-batch of ",
        x.size(0),
        " image(s) of ",
        x.size(2),
        "x",
        x.size(3),
        " reaches layer4 at ",
        h,
        "x",
        w,
        ". Use images of at least 33x33 (convert-images --size), a "
        "data.batch_size of at least 2 (data.batch_size: auto probes 1 "
        "first), or data.drop_last: true when the epoch's last micro-batch "
        "has one image");
  }

  // timm's ResNet.init_weights with zero_init_last.
  void initialise() {
    torch::NoGradGuard no_grad;
    for (const auto& m : modules(/*include_self=*/false)) {
      if (auto* c = m->as<torch::nn::Conv2dImpl>()) {
        torch::nn::init::kaiming_normal_(
            c->weight, 0.0, torch::kFanOut, torch::kReLU);
      }
      if (auto* b = m->as<BottleneckImpl>())
        b->bn3->weight.zero_();
    }
  }

  std::string name_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  std::vector<torch::nn::ModuleList> stages_;
  torch::nn::Linear fc_{nullptr};
};

}  // namespace

std::shared_ptr<Classifier> make_resnet(
    const ModelConfig& cfg, int64_t in_channels, int64_t num_classes) {
  return std::make_shared<ResNet>(
      to_string(cfg.name), spec_of(cfg.name), in_channels, num_classes);
}

}  // namespace memtrain
