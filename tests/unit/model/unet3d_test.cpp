// The 3D U-Net (shapes, names, checkpointing, norms, a few SGD steps) and
// the Dice + cross-entropy loss (a hand-computed value, additivity over the
// batch).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/config/train_config.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

ModelConfig unet_config(int64_t depth, Norm norm) {
  ModelConfig cfg;
  cfg.name = ModelName::kUnet3d;
  cfg.depth = depth;
  cfg.norm = norm;
  cfg.feature_size = 4;
  cfg.seed = 7;
  return cfg;
}

std::shared_ptr<Classifier> build(
    const ModelConfig& cfg, int64_t in, int64_t classes) {
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));  // as make_model
  return make_unet3d(cfg, in, classes);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(UNet3d, OutputShapeAndSegmentOrder) {
  auto net = build(unet_config(3, Norm::kNone), 2, 3);
  const torch::Tensor y = net->forward(torch::randn({2, 2, 8, 12, 4}));
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({2, 3, 8, 12, 4}));
  EXPECT_EQ(
      net->segment_names(),
      (std::vector<std::string>{"enc.0", "dec.0", "enc.1", "dec.1", "enc.2"}));
  EXPECT_EQ(unet3d_divisor(3), 4);
  auto flat = build(unet_config(1, Norm::kNone), 1, 2);
  EXPECT_EQ(flat->segment_names(), std::vector<std::string>{"enc.0"});
  EXPECT_EQ(
      flat->forward(torch::randn({1, 1, 3, 5, 7})).sizes(),
      torch::IntArrayRef({1, 2, 3, 5, 7}));
}

TEST(UNet3d, ParameterNamesAndDeterministicInit) {
  auto net = build(unet_config(2, Norm::kNone), 1, 2);
  std::set<std::string> names;
  for (const auto& p : net->named_parameters())
    names.insert(p.key());
  const std::set<std::string> expected = {
      "enc.0.conv1.weight", "enc.0.conv1.bias",   "enc.0.conv2.weight",
      "enc.0.conv2.bias",   "enc.0.proj.weight",  "enc.0.proj.bias",
      "enc.1.conv1.weight", "enc.1.conv1.bias",   "enc.1.conv2.weight",
      "enc.1.conv2.bias",   "enc.1.proj.weight",  "enc.1.proj.bias",
      "up.0.weight",        "up.0.bias",          "dec.0.conv1.weight",
      "dec.0.conv1.bias",   "dec.0.conv2.weight", "dec.0.conv2.bias",
      "dec.0.proj.weight",  "dec.0.proj.bias",    "head.weight",
      "head.bias"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(
      net->named_parameters()["up.0.weight"].sizes(),
      torch::IntArrayRef({8, 4, 2, 2, 2}));
  EXPECT_EQ(
      net->named_parameters()["dec.0.conv1.weight"].sizes(),
      torch::IntArrayRef({4, 8, 3, 3, 3}));

  // With a norm, the convolutions before it lose their bias.
  auto normed = build(unet_config(2, Norm::kGroup), 1, 2);
  const auto params = normed->named_parameters();
  EXPECT_NE(params.find("enc.0.norm1.weight"), nullptr);
  EXPECT_NE(params.find("dec.0.norm2.bias"), nullptr);
  EXPECT_EQ(params.find("enc.0.conv1.bias"), nullptr);

  // Same seed, same parameters.
  auto again = build(unet_config(2, Norm::kNone), 1, 2);
  for (const auto& p : net->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value(), again->named_parameters()[p.key()]))
        << p.key();
  }
}

// Note [U-Net decoder input]: the decoder block runs its convolutions on
// the upsampled tensor and the skip apart; the output is the textbook
// U-Net's, written here from the parameters with the concatenation.
TEST(UNet3d, DecoderEqualsTheConvolutionOfTheConcatenation) {
  auto net = build(unet_config(2, Norm::kNone), 2, 3);
  const auto p = net->named_parameters();
  const auto conv =
      [&](const torch::Tensor& x, const std::string& name, int64_t pad) {
        return torch::conv3d(x, p[name + ".weight"], p[name + ".bias"], 1, pad);
      };
  const auto block = [&](const torch::Tensor& x, const std::string& b) {
    torch::Tensor h = torch::relu(conv(x, b + ".conv1", 1));
    return torch::relu(conv(h, b + ".conv2", 1) + conv(x, b + ".proj", 0));
  };
  const torch::Tensor x = torch::randn({2, 2, 8, 6, 4});
  const torch::Tensor e0 = block(x, "enc.0");
  const torch::Tensor e1 = block(torch::max_pool3d(e0, 2), "enc.1");
  const torch::Tensor up =
      torch::conv_transpose3d(e1, p["up.0.weight"], p["up.0.bias"], 2);
  const torch::Tensor d0 = block(torch::cat({up, e0}, 1), "dec.0");
  const torch::Tensor want = conv(d0, "head", 0);
  EXPECT_LT(max_abs_diff(net->forward(x), want), 1e-5);
  net->set_checkpointed(net->num_segments());
  EXPECT_LT(max_abs_diff(net->forward(x), want), 1e-5);
  // Not lean (no memory.budget): the concatenation itself, the same
  // function, checkpointed or not (forward without gradients: split).
  net->set_memory_lean(false);
  EXPECT_LT(max_abs_diff(net->forward(x), want), 1e-5);
  net->set_checkpointed(0);
  EXPECT_LT(max_abs_diff(net->forward(x), want), 1e-5);
}

// Note [U-Net decoder input]: the split and the concatenation train the
// same model: gradients equal to float32 rounding.
TEST(UNet3d, LeanOrNotTheGradientsAgree) {
  auto net = build(unet_config(3, Norm::kInstance), 1, 3);
  const torch::Tensor x = torch::randn({2, 1, 8, 8, 8});
  const torch::Tensor target = torch::randint(0, 3, {2, 8, 8, 8});
  std::vector<std::map<std::string, torch::Tensor>> grads;
  for (bool lean : {true, false}) {
    net->set_memory_lean(lean);
    net->zero_grad();
    dice_ce_loss_sum(net->forward(x), target).backward();
    grads.emplace_back();
    for (const auto& p : net->named_parameters())
      grads.back()[p.key()] = p.value().grad().clone();
  }
  for (const auto& [name, g] : grads[0])
    EXPECT_LE(max_abs_diff(g, grads[1].at(name)), 1e-5) << name;
}

TEST(UNet3d, CheckpointingChangesNeitherOutputNorGradients) {
  auto net = build(unet_config(3, Norm::kInstance), 1, 3);
  const torch::Tensor x = torch::randn({2, 1, 8, 8, 8});
  const torch::Tensor target = torch::randint(0, 3, {2, 8, 8, 8});
  std::vector<torch::Tensor> outs;
  std::vector<std::map<std::string, torch::Tensor>> grads;
  for (int64_t count : {int64_t{0}, net->num_segments()}) {
    net->set_checkpointed(count);
    net->zero_grad();
    const torch::Tensor y = net->forward(x);
    dice_ce_loss_sum(y, target).backward();
    outs.push_back(y.detach());
    grads.emplace_back();
    for (const auto& p : net->named_parameters())
      grads.back()[p.key()] = p.value().grad().clone();
  }
  EXPECT_LE(max_abs_diff(outs[0], outs[1]), 1e-6);
  for (const auto& [name, g] : grads[0])
    EXPECT_LE(max_abs_diff(g, grads[1].at(name)), 1e-6) << name;
}

// Note [U-Net segment order]: each further checkpointed segment saves no
// more activation memory than the one before it.
TEST(UNet3d, CheckpointSavingsFollowSegmentOrder) {
  memory::DeviceScope device;
  auto net = build(unet_config(3, Norm::kGroup), 1, 2);
  const torch::Tensor x = torch::randn({1, 1, 16, 16, 16});
  std::vector<int64_t> held;  // activation bytes after forward
  for (int64_t k = 0; k <= net->num_segments(); ++k) {
    net->set_checkpointed(k);
    const int64_t before = memory::stats().allocated;
    const torch::Tensor y = net->forward(x);
    held.push_back(memory::stats().allocated - before);
  }
  for (size_t k = 0; k + 1 < held.size(); ++k) {
    EXPECT_GT(held[k], held[k + 1]) << "segment " << k;
    if (k + 2 < held.size()) {
      EXPECT_GE(held[k] - held[k + 1], held[k + 1] - held[k + 2])
          << "segment " << net->segment_names()[k] << " saves less than "
          << net->segment_names()[k + 1];
    }
  }
}

// Note [U-Net checkpoints]: with every segment checkpointed the peak of a
// forward and backward falls to about 0.6x of the unchecked one, with
// equal gradients: issue 12's size (64^3, feature_size 16, depth 3,
// instance norm, micro-batch 2; bench_memory measures the whole window).
// The figure depends on the instructions oneDNN picks its blocked layouts
// (and so its reorder buffers) for: 0.582 with AVX-512 (the machine of
// issue 12), 0.601 with AVX2 (295,712,256 / 491,821,568 B), 0.552 with
// ONEDNN_MAX_CPU_ISA=AVX or SSE41 (262,227,968 / 475,021,312 B); the
// bound is 0.61 so that every x86-64 machine holds it, and a regression
// of one checkpointed block's activations (several percent) still fails.
TEST(UNet3d, CheckpointingAllCutsThePeakToAbout06) {
  ModelConfig cfg = unet_config(3, Norm::kInstance);
  cfg.feature_size = 16;
  auto net = build(cfg, 1, 3);
  // As a training rank with two threads: with one, LibTorch runs the 1x1x1
  // convolutions of micro-batches below 16 without oneDNN (slow_conv3d),
  // whose buffers differ.
  const int threads = torch::get_num_threads();
  torch::set_num_threads(2);
  const torch::Tensor x = torch::randn({2, 1, 64, 64, 64});
  const torch::Tensor target = torch::randint(0, 3, {2, 64, 64, 64});
  std::vector<int64_t> peaks;
  std::vector<std::vector<torch::Tensor>> grads;
  for (int64_t count : {int64_t{0}, net->num_segments()}) {
    net->set_checkpointed(count);
    net->zero_grad();
    memory::release_cache();
    memory::reset_peak();
    {
      memory::DeviceScope device;
      const int64_t before = memory::stats().allocated;
      torch::Tensor loss = dice_ce_loss_sum(net->forward(x), target);
      loss.backward();
      peaks.push_back(memory::stats().peak_allocated - before);
    }
    grads.emplace_back();
    for (const auto& p : net->parameters())
      grads.back().push_back(p.grad().clone());
  }
  torch::set_num_threads(threads);
  const double ratio = static_cast<double>(peaks[1]) / peaks[0];
  std::printf(
      "unet3d 64^3 f16 peak all/off: %ld / %ld = %.3f\n",
      (long)peaks[1],
      (long)peaks[0],
      ratio);
  EXPECT_LE(ratio, 0.61);
  for (size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_LE(max_abs_diff(grads[0][i], grads[1][i]), 1e-6) << i;
}

TEST(UNet3d, IndivisibleShapeThrowsNamingShapeAndDivisor) {
  auto net = build(unet_config(3, Norm::kNone), 1, 2);
  try {
    net->forward(torch::randn({1, 1, 8, 6, 8}));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[1, 1, 8, 6, 8]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("multiples of 4"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.patch_size"), std::string::npos) << msg;
    EXPECT_NE(msg.find("validation.roi"), std::string::npos) << msg;
  }
  EXPECT_THROW(net->forward(torch::randn({1, 2, 8, 8, 8})), Error);
  EXPECT_THROW(net->forward(torch::randn({1, 8, 8, 8})), Error);
  EXPECT_THROW(build(unet_config(0, Norm::kNone), 1, 2), Error);
  // An unknown norm never reaches the model: the config refuses it.
  EXPECT_THROW(
      TrainConfig::load("", {"model.name=unet3d", "model.norm=batch"}), Error);
}

TEST(UNet3d, InstanceAndGroupNormRun) {
  for (const Norm norm : {Norm::kInstance, Norm::kGroup}) {
    auto net = build(unet_config(2, norm), 2, 3);
    const torch::Tensor y = net->forward(torch::randn({2, 2, 4, 8, 4}));
    EXPECT_EQ(y.sizes(), torch::IntArrayRef({2, 3, 4, 8, 4})) << norm;
    dice_ce_loss_sum(y, torch::randint(0, 3, {2, 4, 8, 4})).backward();
    for (const auto& p : net->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << norm << " " << p.key();
      EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>());
    }
  }
}

TEST(UNet3d, RunsUnderBf16Autocast) {
  auto net = build(unet_config(2, Norm::kGroup), 1, 2);
  torch::Tensor y;
  {
    compat::AutocastGuard amp(true, /*cuda=*/false, torch::kBFloat16);
    y = net->forward(torch::randn({1, 1, 4, 4, 4}));
  }
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);  // the head ran in bf16
  EXPECT_EQ(y.sizes(), torch::IntArrayRef({1, 2, 4, 4, 4}));
  EXPECT_TRUE(torch::isfinite(y.to(torch::kFloat32)).all().item<bool>());
}

TEST(UNet3d, SgdStepsReduceDiceCeLoss) {
  auto net = build(unet_config(2, Norm::kInstance), 1, 2);
  torch::manual_seed(3);
  const torch::Tensor x = torch::randn({2, 1, 8, 8, 8});
  const torch::Tensor target = (x.squeeze(1) > 0.3).to(torch::kInt64);
  torch::optim::SGD sgd(
      net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  std::vector<double> losses;
  for (int step = 0; step < 8; ++step) {
    sgd.zero_grad();
    const torch::Tensor loss = dice_ce_loss_sum(net->forward(x), target) / 2;
    loss.backward();
    sgd.step();
    losses.push_back(loss.item<double>());
  }
  EXPECT_LT(losses.back(), 0.8 * losses.front())
      << losses.front() << " -> " << losses.back();
}

TEST(DiceCe, HandComputedValue) {
  // One sample, two classes, two voxels: logits (0, 0) with target 0
  // (p = 1/2, 1/2) and (0, ln 3) with target 1 (p = 1/4, 3/4).
  const torch::Tensor logits =
      torch::tensor({0.0, 0.0, 0.0, std::log(3.0)}, torch::kFloat64)
          .view({1, 2, 1, 1, 2});  // class 0: [0, 0], class 1: [0, ln 3]
  const torch::Tensor target = torch::tensor({0, 1}).view({1, 1, 1, 2});
  const double eps = 1e-5;
  const double ce = (std::log(2.0) + std::log(4.0 / 3.0)) / 2;
  const double dice0 = (2 * 0.5 + eps) / (0.75 + 1 + eps);
  const double dice1 = (2 * 0.75 + eps) / (1.25 + 1 + eps);
  const double expected = ce + 1 - (dice0 + dice1) / 2;
  const torch::Tensor loss = dice_ce_loss_sum(logits, target);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(loss.item<double>(), expected, 1e-6);
  // Half-precision logits are computed in fp32: the same value as the
  // rounded logits in double, and a float32 result.
  const torch::Tensor half = logits.to(torch::kBFloat16);
  const torch::Tensor from_half = dice_ce_loss_sum(half, target);
  EXPECT_EQ(from_half.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(
      from_half.item<double>(),
      dice_ce_loss_sum(half.to(torch::kFloat64), target).item<double>(),
      1e-6);
  EXPECT_THROW(dice_ce_loss_sum(logits, target.to(torch::kInt32)), Error);
  EXPECT_THROW(dice_ce_loss_sum(logits, target.view({1, 2, 1, 1})), Error);
}

TEST(DiceCe, AdditiveOverTheBatch) {
  torch::manual_seed(11);
  const torch::Tensor logits = torch::randn({4, 3, 2, 4, 4});
  const torch::Tensor target = torch::randint(0, 3, {4, 2, 4, 4});
  const torch::Tensor whole = logits.clone().requires_grad_();
  const torch::Tensor a = logits.slice(0, 0, 2).clone().requires_grad_();
  const torch::Tensor b = logits.slice(0, 2, 4).clone().requires_grad_();
  const torch::Tensor l_whole = dice_ce_loss_sum(whole, target);
  const torch::Tensor l_a = dice_ce_loss_sum(a, target.slice(0, 0, 2));
  const torch::Tensor l_b = dice_ce_loss_sum(b, target.slice(0, 2, 4));
  EXPECT_NEAR(
      l_whole.item<double>(), l_a.item<double>() + l_b.item<double>(), 1e-5);
  l_whole.backward();
  l_a.backward();
  l_b.backward();
  EXPECT_LE(max_abs_diff(whole.grad(), torch::cat({a.grad(), b.grad()})), 1e-6);
  // ... and each sample's loss is one of its terms: a batch Dice would not be.
  const torch::Tensor l_0 =
      dice_ce_loss_sum(logits.slice(0, 0, 1), target.slice(0, 0, 1));
  const torch::Tensor l_1 =
      dice_ce_loss_sum(logits.slice(0, 1, 2), target.slice(0, 1, 2));
  EXPECT_NEAR(
      l_a.item<double>(), l_0.item<double>() + l_1.item<double>(), 1e-5);
}

}  // namespace
}  // namespace memtrain
