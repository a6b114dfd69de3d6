// Selective recompute (Note [Selective recompute]): a checkpointed segment
// that keeps its convolutions' and matrix products' outputs (Note [Kept
// matrix products]) gives the gradients of no
// checkpointing bit for bit in fp32, holds a peak between no checkpointing
// and full checkpointing, and refuses a kept output changed in place.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/config/choices.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/blocks/transformer.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/models.h"
#include "memtrain/model/nets/dual_encoder.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "tier_steps.h"

namespace memtrain {
namespace {

using tier_test::expect_bitwise;
using tier_test::step;
using tier_test::Step;
using tier_test::Tier;
using tier_test::unet;

// The U-Net, split decoder input (lean) or concatenated, instance or group
// norm: selective equals no checkpointing bit for bit, and its peak lies
// between full checkpointing's and none's.
TEST(SelectiveRecompute, UNetGradientsAreBitwiseThoseOfNoCheckpointing) {
  const tier_test::VolumeBatch batch(1, {2, 16, 16, 16});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  tier_test::for_each_unet_form([&](Classifier& net) {
    const Step off = step(net, Tier::kOff, x, loss);
    const Step sel = step(net, Tier::kSelective, x, loss);
    const Step all = step(net, Tier::kAll, x, loss);
    expect_bitwise(off, sel, "selective vs off");
    EXPECT_LT(sel.peak, off.peak);
    EXPECT_GT(sel.peak, all.peak);
    std::printf(
        "unet3d 16^3 peak off %ld, selective %ld, all %ld\n",
        static_cast<long>(off.peak),
        static_cast<long>(sel.peak),
        static_cast<long>(all.peak));
  });
}

// SE-ResNeXt50's bottlenecks (batch-norm, grouped convolutions, the SE
// gate): the same, and the running statistics are updated once.
TEST(SelectiveRecompute, SeResNeXtGradientsAreBitwiseThoseOfNoCheckpointing) {
  ModelConfig cfg;
  cfg.name = ModelName::kSeresnext50;
  cfg.seed = 3;
  auto net = make_model(cfg, {SampleKind::kImages, {3, 32, 32}, 5, 0});
  {
    torch::NoGradGuard no_grad;  // no zero gammas: every weight has a gradient
    torch::manual_seed(11);
    for (const auto& p : net->named_parameters()) {
      if (p.key().find(".weight") != std::string::npos && p.value().dim() == 1)
        p.value().copy_(1.0 + 0.3 * torch::randn_like(p.value()));
    }
  }
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({2, 3, 32, 32});
  const torch::Tensor y = torch::tensor({0, 4});
  const auto loss = [&](const torch::Tensor& z) {
    return torch::nn::functional::cross_entropy(z, y);
  };
  std::map<std::string, torch::Tensor> start;
  for (const auto& b : net->named_buffers())
    start[b.key()] = b.value().clone();
  const auto reset_buffers = [&] {
    torch::NoGradGuard no_grad;
    for (const auto& b : net->named_buffers())
      b.value().copy_(start.at(b.key()));
  };
  const Step off = step(*net, Tier::kOff, x, loss);
  std::map<std::string, torch::Tensor> after_off;
  for (const auto& b : net->named_buffers())
    after_off[b.key()] = b.value().clone();
  reset_buffers();
  const Step sel = step(*net, Tier::kSelective, x, loss);
  expect_bitwise(off, sel, "selective vs off");
  for (const auto& b : net->named_buffers()) {
    EXPECT_TRUE(torch::equal(b.value(), after_off.at(b.key())))
        << b.key() << ": running statistics updated once, as without";
  }
  reset_buffers();
  const Step all = step(*net, Tier::kAll, x, loss);
  EXPECT_LT(sel.peak, off.peak);
  EXPECT_GT(sel.peak, all.peak);
}

// The small CNN's stages keep their convolutions too.
TEST(SelectiveRecompute, CnnGradientsAreBitwiseThoseOfNoCheckpointing) {
  ModelConfig c;
  c.name = ModelName::kCnn;
  c.hidden = 4;
  c.depth = 3;
  c.norm = Norm::kGroup;
  auto net = make_model(c, {SampleKind::kImages, {2, 16, 16}, 3, 0});
  torch::manual_seed(2);
  const torch::Tensor x = torch::randn({8, 2, 16, 16});
  const torch::Tensor y = torch::randint(0, 3, {8});
  const auto loss = [&](const torch::Tensor& z) {
    return torch::nn::functional::cross_entropy(z, y);
  };
  expect_bitwise(
      step(*net, Tier::kOff, x, loss),
      step(*net, Tier::kSelective, x, loss),
      "selective vs off");
}

// A model of sub-models passes the mode on: the dual encoder's CNN image
// tower keeps its convolutions (more held after the forward than with full
// checkpointing) and gives the gradients of no checkpointing.
TEST(SelectiveRecompute, DualEncoderTowersGetTheMode) {
  ModelConfig cfg;
  cfg.name = ModelName::kDualEncoder;
  cfg.hidden = 8;
  cfg.depth = 2;
  cfg.embed_dim = 6;
  auto net = make_dual_encoder(cfg, {SampleKind::kImages, {3, 16, 16}, 0, 4});
  torch::manual_seed(8);
  const torch::Tensor x = torch::randn({4, 3, 16, 16});
  const torch::Tensor c = torch::randn({4, 4});
  std::vector<Step> steps;
  for (Tier tier : {Tier::kOff, Tier::kSelective, Tier::kAll}) {
    tier_test::set_tier(*net, tier);
    net->zero_grad();
    memory::release_cache();
    memory::reset_peak();
    Step s;
    {
      memory::DeviceScope device;
      const int64_t before = memory::stats().allocated;
      const torch::Tensor z = net->forward(x, c);
      s.peak = memory::stats().allocated - before;  // held after forward
      z.pow(2).sum().backward();
      s.out = z.detach();
    }
    for (const auto& p : net->named_parameters()) {
      if (p.value().grad().defined())  // not the logit scale: no loss here
        s.grads[p.key()] = p.value().grad().clone();
    }
    steps.push_back(std::move(s));
  }
  expect_bitwise(steps[0], steps[1], "selective vs off");
  EXPECT_GT(steps[1].peak, steps[2].peak) << "the tower kept nothing";
  EXPECT_LT(steps[1].peak, steps[0].peak);
}

// Under bf16 autocast the kept outputs are bf16 and their backward casts
// input and weight as autocast does: the gradients of bf16 without
// checkpointing (to rounding), not fp32's.
TEST(SelectiveRecompute, Bf16KeepsAutocastsCasts) {
  auto net = unet(Norm::kInstance, true);
  const tier_test::VolumeBatch batch(4, {2, 16, 16, 16});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  const Step off = step(*net, Tier::kOff, x, loss, true);
  const Step sel = step(*net, Tier::kSelective, x, loss, true);
  const Step fp32 = step(*net, Tier::kOff, x, loss, false);
  double worst = 0, from_fp32 = 0;
  for (const auto& [name, g] : off.grads) {
    worst =
        std::max(worst, (g - sel.grads.at(name)).abs().max().item<double>());
    from_fp32 = std::max(
        from_fp32, (g - fp32.grads.at(name)).abs().max().item<double>());
  }
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(from_fp32, 1e-4) << "bf16 must differ from fp32 for this to test";
}

// kept_linear on its own (Note [Kept matrix products]): inputs of 1 to 4
// axes, contiguous or a transposed view, with and without a bias, one
// of them used twice in the segment, each in a selective segment between
// cheap ops: the output and the gradients (input, weight, bias) of no
// checkpointing bit for bit, and nothing but the kept outputs recomputed.
TEST(SelectiveRecompute, KeptLinearGradientsAreBitwiseThoseOfNoCheckpointing) {
  torch::manual_seed(12);
  const torch::Tensor w1 = torch::randn({7, 5}, torch::requires_grad());
  const torch::Tensor b1 = torch::randn({7}, torch::requires_grad());
  const torch::Tensor w2 = torch::randn({5, 7}, torch::requires_grad());
  // A weight that is a transposed view (mm_mat2_backward's general case).
  const torch::Tensor w3 = torch::randn({7, 5}, torch::requires_grad());
  const std::vector<torch::Tensor> inputs = {
      torch::randn({5}),
      torch::randn({9, 5}),
      torch::randn({3, 4, 5}),
      torch::randn({2, 3, 4, 5}),
      torch::randn({4, 5, 3}).transpose(1, 2),  // not contiguous
      torch::randn({1, 5}),                     // one row
      torch::randn({5, 9}).t(),  // column-major rows (mm_mat1_backward's)
  };
  const auto segment = [&](const at::Tensor& t) {
    const torch::Tensor h = torch::gelu(kept_linear(torch::tanh(t), w1, b1));
    return kept_linear(h, w2, {}) * t + kept_linear(h.sin(), w3.t(), {});
  };
  for (const torch::Tensor& input : inputs) {
    std::vector<torch::Tensor> grads[2];
    torch::Tensor out[2];
    for (int c = 0; c < 2; ++c) {
      const torch::Tensor x = input.detach().clone().requires_grad_(true);
      for (const torch::Tensor& p : {w1, b1, w2, w3})
        p.mutable_grad() = torch::Tensor();
      out[c] =
          c == 0 ? segment(x) : checkpoint(segment, x, Recompute::kSelective);
      out[c].pow(2).sum().backward();
      for (const torch::Tensor& p : {x, w1, b1, w2, w3})
        grads[c].push_back(p.grad().clone());
    }
    EXPECT_TRUE(torch::equal(out[0], out[1])) << input.sizes();
    for (size_t i = 0; i < grads[0].size(); ++i) {
      EXPECT_TRUE(torch::equal(grads[0][i], grads[1][i]))
          << input.sizes() << " operand " << i << " differs by "
          << (grads[0][i] - grads[1][i]).abs().max().item<double>();
    }
  }
}

// The transformer block (open_clip's, causal and not): selective keeps the
// projections' and the MLP's outputs, gives the gradients of no checkpointing
// bit for bit, and holds a peak strictly between full checkpointing's and
// none's.
TEST(SelectiveRecompute, TransformerGradientsAreBitwiseThoseOfNoCheckpointing) {
  for (const bool causal : {false, true}) {
    torch::manual_seed(4);
    Transformer t(48, 3, 4, 4.0, Activation::kGelu);
    const torch::Tensor x = torch::randn({4, 33, 48});
    Step steps[3];
    const Recompute modes[3] = {
        Recompute::kAll, Recompute::kSelective, Recompute::kAll};
    for (int c = 0; c < 3; ++c) {
      for (auto& p : t.parameters())
        p.mutable_grad() = torch::Tensor();
      memory::release_cache();
      memory::reset_peak();
      memory::DeviceScope device;
      const int64_t before = memory::stats().allocated;
      const torch::Tensor in = x.clone().requires_grad_(true);
      const torch::Tensor y = t.forward(in, causal, c == 0 ? 0 : 3, modes[c]);
      steps[c].peak = memory::stats().allocated - before;  // held
      y.pow(2).sum().backward();
      steps[c].out = y.detach();
      steps[c].grads["input"] = in.grad().clone();
      for (const auto& p : t.named_parameters())
        steps[c].grads[p.key()] = p.value().grad().clone();
    }
    expect_bitwise(steps[0], steps[1], "selective vs off");
    EXPECT_LT(steps[1].peak, steps[0].peak) << causal;
    EXPECT_GT(steps[1].peak, steps[2].peak) << causal;
  }
}

// Under bf16 autocast the kept linears' and attention's outputs are bf16
// and their backward casts rows and weight as autocast casts addmm's:
// the gradients of bf16 without checkpointing (to rounding), not fp32's.
TEST(SelectiveRecompute, TransformerBf16KeepsAutocastsCasts) {
  torch::manual_seed(5);
  Transformer t(32, 2, 2, 4.0, Activation::kGelu);
  const torch::Tensor x = torch::randn({2, 9, 32});
  std::vector<torch::Tensor> grads[3];
  const bool bf16[3] = {true, true, false};
  for (int c = 0; c < 3; ++c) {
    for (auto& p : t.parameters())
      p.mutable_grad() = torch::Tensor();
    torch::Tensor y;
    {
      compat::AutocastGuard amp(bf16[c], false, torch::kBFloat16);
      y = t.forward(x, false, c == 1 ? 2 : 0, Recompute::kSelective);
    }
    y.to(torch::kFloat32).pow(2).sum().backward();
    for (auto& p : t.parameters())
      grads[c].push_back(p.grad().clone());
  }
  double worst = 0, from_fp32 = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const double scale = grads[0][i].abs().max().item<double>() + 1e-12;
    worst = std::max(
        worst, (grads[0][i] - grads[1][i]).abs().max().item<double>() / scale);
    from_fp32 = std::max(
        from_fp32,
        (grads[0][i] - grads[2][i]).abs().max().item<double>() / scale);
  }
  EXPECT_LE(worst, 1e-6);
  EXPECT_GT(from_fp32, 1e-4) << "bf16 must differ from fp32 for this to test";
}

// The MLP's blocks keep their linears' outputs and recompute the group
// norm, the activation and the dropout, whose mask the saved RNG draws
// again: the gradients of no checkpointing bit for bit, and between the
// forward and the backward less held than none, more than all.
TEST(SelectiveRecompute, MlpWithDropoutIsBitwiseThatOfNoCheckpointing) {
  ModelConfig c;
  c.name = ModelName::kMlp;
  c.hidden = 64;
  c.depth = 4;
  c.norm = Norm::kGroup;
  c.dropout = 0.3;
  auto net = make_model(c, {SampleKind::kFeatures, {20}, 4, 0});
  net->train();
  torch::manual_seed(3);
  // Enough rows that the kept outputs, not the step's other tensors, set
  // the peaks (at 16 rows of 32 LibTorch 2.11's selective and all peaked
  // at the same point).
  const torch::Tensor x = torch::randn({64, 20});
  const torch::Tensor y = torch::randint(0, 4, {64});
  const auto loss = [&](const torch::Tensor& z) {
    return torch::nn::functional::cross_entropy(z, y);
  };
  std::vector<Step> steps;
  for (const Tier t : {Tier::kOff, Tier::kSelective, Tier::kAll}) {
    torch::manual_seed(21);  // the same dropout masks at every tier
    steps.push_back(step(*net, t, x, loss));
  }
  expect_bitwise(steps[0], steps[1], "selective vs off");
  // What each tier holds after the forward (the step's peak comes later,
  // in backward, where LibTorch 2.11 holds the same at selective and all).
  int64_t held[3];
  const Tier tiers[3] = {Tier::kOff, Tier::kSelective, Tier::kAll};
  for (int t = 0; t < 3; ++t) {
    tier_test::set_tier(*net, tiers[t]);
    memory::release_cache();
    memory::DeviceScope device;
    const int64_t before = memory::stats().allocated;
    const torch::Tensor z = net->forward(x);
    held[t] = memory::stats().allocated - before;
  }
  EXPECT_LT(held[1], held[0]);
  EXPECT_GT(held[1], held[2]);
}

// A segment that changes a kept output in place would get it back changed
// in backward: refused by name, not a wrong gradient.
TEST(SelectiveRecompute, KeptOutputChangedInPlaceIsRefused) {
  torch::manual_seed(6);
  const torch::Tensor w = torch::randn({4, 2, 3, 3}, torch::requires_grad());
  const torch::Tensor x = torch::randn({1, 2, 8, 8}, torch::requires_grad());
  const int64_t one[] = {1, 1};
  const auto segment = [&](const at::Tensor& t) {
    torch::Tensor y = kept_conv(t, w, {}, one, one, one, 1);
    EXPECT_TRUE(keeping_outputs());
    return torch::relu(y.mul_(2.0));  // in place on a kept output
  };
  const torch::Tensor y = checkpoint(segment, x, Recompute::kSelective);
  EXPECT_FALSE(keeping_outputs());
  try {
    y.sum().backward();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(
        std::string(e.what()).find("modified in place"), std::string::npos)
        << e.what();
  }
}

TEST(SelectiveRecompute, GradientCheckpointingSelectiveIsAChoice) {
  EXPECT_EQ(choice_of<Checkpointing>("selective"), Checkpointing::kSelective);
}

}  // namespace
}  // namespace memtrain
