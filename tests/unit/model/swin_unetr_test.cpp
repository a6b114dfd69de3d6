// model.name=swin_unetr (MONAI's SwinUNETR; the comparison with MONAI
// itself is tests/e2e/swin_unetr_monai.sh): attention through compat
// against the written-out math, checkpointing at every tier against none,
// the segments, and what it refuses.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/swin_unetr.h"
#include "memtrain/model/volume_model.h"
#include "reference_attention.h"
#include "test_support.h"
#include "tier_steps.h"
#include "transfer_counter.h"

namespace memtrain {
namespace {

using tier_test::Step;
using tier_test::Tier;

std::shared_ptr<Classifier> swin(int64_t feature = 12) {
  ModelConfig cfg;
  cfg.name = ModelName::kSwinUnetr;
  cfg.feature_size = feature;
  cfg.seed = 3;
  torch::manual_seed(3);
  return make_swin_unetr(cfg, 1, 3);
}

// compat::attention (scaled_dot_product_attention on LibTorch 2.x, the math
// on 1.13) against an independent float64 attention, with a bias per
// (batch, head) broadcast over the batch, forward and backward, to fp32
// rounding.
TEST(SwinUnetr, AttentionAgreesWithAFloat64Attention) {
  torch::manual_seed(0);
  const torch::Tensor q = torch::randn({2, 6, 49, 8}),
                      k = torch::randn({2, 6, 49, 8}),
                      v = torch::randn({2, 6, 49, 8}),
                      bias = torch::randn({6, 49, 49}),
                      g = torch::randn({2, 6, 49, 8});
  const auto err = test::attention_error(
      [](const auto& q, const auto& k, const auto& v, const auto& b) {
        return compat::attention(q, k, v, b, 0.35);
      },
      q,
      k,
      v,
      bias,
      0.35,
      false,
      g);
  for (size_t i = 0; i < err.size(); ++i)
    EXPECT_LE(err[i], 1e-5) << (i == 0 ? "forward" : "gradient ") << i;
}

// MONAI's compute_mask: a host image of region numbers, one per triple of
// Python slices (slice(-w), slice(-w, -s), slice(-s, None)) per axis,
// numbered in loop order, windowed, and compared token by token.
torch::Tensor monai_mask(
    const std::array<int64_t, 3>& d,
    const std::array<int64_t, 3>& w,
    const std::array<int64_t, 3>& s) {
  auto norm = [](int64_t i, int64_t n) {
    return std::min<int64_t>(std::max<int64_t>(i < 0 ? i + n : i, 0), n);
  };
  auto slices = [&](size_t a) {  // [first, last) of each slice
    const int64_t n = d[a];
    return std::array<std::pair<int64_t, int64_t>, 3>{
        std::make_pair(int64_t{0}, norm(-w[a], n)),
        std::make_pair(norm(-w[a], n), norm(-s[a], n)),
        std::make_pair(norm(-s[a], n), n)};
  };
  torch::Tensor img = torch::zeros({1, d[0], d[1], d[2], 1});
  double cnt = 0;
  for (const auto& a : slices(0)) {
    for (const auto& b : slices(1)) {
      for (const auto& c : slices(2)) {
        if (a.second > a.first && b.second > b.first && c.second > c.first)
          img.narrow(1, a.first, a.second - a.first)
              .narrow(2, b.first, b.second - b.first)
              .narrow(3, c.first, c.second - c.first)
              .fill_(cnt);
        cnt += 1;
      }
    }
  }
  const torch::Tensor mw =
      img.view({1, d[0] / w[0], w[0], d[1] / w[1], w[1], d[2] / w[2], w[2]})
          .permute({0, 1, 3, 5, 2, 4, 6})
          .reshape({-1, w[0] * w[1] * w[2]});
  torch::Tensor mask = mw.unsqueeze(1) - mw.unsqueeze(2);
  return mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0);
}

// The shifted blocks' mask, made from arange on the device, is MONAI's:
// windows of 7 shifted by 3 on every axis, and an axis that fits one
// window (no shift there).
TEST(SwinUnetr, ShiftMaskIsMonais) {
  using A = std::array<int64_t, 3>;
  for (const auto& [d, w, s] :
       {std::make_tuple(A{21, 21, 21}, A{7, 7, 7}, A{3, 3, 3}),
        std::make_tuple(A{14, 4, 21}, A{7, 4, 7}, A{3, 0, 3}),
        std::make_tuple(A{7, 14, 28}, A{7, 7, 7}, A{0, 3, 3})}) {
    const torch::Tensor ours =
        detail::swin_shift_mask(d, w, s, torch::Device(torch::kCPU));
    const torch::Tensor theirs = monai_mask(d, w, s);
    ASSERT_EQ(ours.sizes(), theirs.sizes()) << d[0] << "x" << d[1];
    EXPECT_TRUE(torch::equal(ours, theirs)) << d[0] << "x" << d[1];
    // Both kinds of entry are there: the mask masks something.
    EXPECT_GT(ours.eq(-100).sum().item<int64_t>(), 0);
  }
}

// Forward and backward, plain and checkpointed (the mask is made again in
// the recomputation), call nothing that crosses between host and device:
// no tensor moved to a device, no value read back (on a GPU each would be
// a blocking copy: a host sync the loop's counter does not see).
TEST(SwinUnetr, ForwardAndBackwardCrossNothingToTheHost) {
  const tier_test::VolumeBatch batch(1, {1, 32, 32, 64});
  const auto net = swin();
  for (const tier_test::Tier t :
       {tier_test::Tier::kOff, tier_test::Tier::kAll}) {
    tier_test::set_tier(*net, t);
    net->zero_grad();
    test::TransferCounter counter;
    net->forward(batch.x).pow(2).sum().backward();
    EXPECT_EQ(counter.count(), 0) << counter.calls();
  }
}

// What the counter counts, on either build: a move that names a device
// (on the CPU build the CPU), a read of one value; not a change of dtype,
// nor a tensor made on a device.
TEST(TransferCounter, CountsMovesAndReadsOnly) {
  const torch::Tensor t = torch::ones({3});
  test::TransferCounter counter;
  (void)t.to(torch::kFloat64);
  (void)torch::arange(3, torch::TensorOptions().device(t.device()));
  EXPECT_EQ(counter.count(), 0) << counter.calls();
  (void)t.to(t.device());
  EXPECT_EQ(counter.count(), 1) << counter.calls();
  (void)t.sum().item<double>();
  EXPECT_EQ(counter.count(), 2) << counter.calls();
  EXPECT_EQ(
      counter.calls(), "aten::to(cpu -> cpu), aten::_local_scalar_dense(cpu)");
}

TEST(SwinUnetr, SegmentsAndMonaiNames) {
  const auto net = swin();
  // Note [SwinUNETR's segments]: each Swin block one segment (the last of
  // a stage with its merging), the encoders and decoders one each.
  const std::vector<std::string> names = net->segment_names();
  EXPECT_EQ(names.size(), 18u);
  EXPECT_EQ(names.front(), "layers1.0.blocks.0");
  EXPECT_EQ(names[1], "layers1.0.blocks.1");
  EXPECT_EQ(names[2], "decoder1");
  EXPECT_EQ(names.back(), "encoder10");
  for (int stage = 1; stage <= 4; ++stage) {
    for (int block = 0; block < 2; ++block) {
      const std::string name = "layers" + std::to_string(stage) + ".0.blocks." +
                               std::to_string(block);
      EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name;
    }
  }
  const auto params = net->named_parameters();
  EXPECT_TRUE(params.contains(
      "swinViT.layers1.0.blocks.1.attn.relative_position_bias_table"));
  EXPECT_TRUE(params.contains("swinViT.layers4.0.downsample.reduction.weight"));
  EXPECT_TRUE(params.contains("decoder1.conv_block.conv3.conv.weight"));
  EXPECT_TRUE(params.contains("out.conv.conv.bias"));
  EXPECT_EQ(
      net->named_buffers()
          ["swinViT.layers1.0.blocks.0.attn.relative_position_index"]
              .sizes(),
      torch::IntArrayRef({343, 343}));
}

// Every segment checkpointed, at each tier: the output of no checkpointing
// bit for bit and its gradients to fp32 rounding (all, selective and
// offload recompute the same arithmetic; the patch embedding's bias sums
// a gradient that reaches it in another memory layout: 1.2e-10 apart),
// with a lower device peak.
TEST(SwinUnetr, CheckpointedTiersGiveTheSameGradients) {
  const auto pool = std::make_shared<memory::HostPool>(0);
  memory::set_offload_pool(pool);
  const tier_test::VolumeBatch batch(1, {1, 32, 32, 64});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  const auto net = swin();
  const Step off = tier_test::step(*net, Tier::kOff, x, loss);
  for (const Tier t : {Tier::kAll, Tier::kSelective, Tier::kOffload}) {
    const Step s = tier_test::step(*net, t, x, loss);
    EXPECT_TRUE(torch::equal(off.out, s.out));
    for (const auto& [name, g] : off.grads) {
      const double scale = g.abs().max().item<double>();
      EXPECT_LE(
          (g - s.grads.at(name)).abs().max().item<double>(),
          1e-6 * scale + 1e-9)
          << name << " at tier " << static_cast<int>(t);
    }
    EXPECT_LT(s.peak, off.peak) << static_cast<int>(t);
  }
  memory::set_offload_pool(nullptr);
}

// Note [SwinUNETR's faster form]: on the CPU the model has a lean form
// (the blocked attention) and a faster one (LibTorch's attention, its
// probabilities kept for backward): the same output and gradients to fp32
// rounding, a higher peak for the faster, and in the faster form every
// segment checkpointed whole repeats the forward bit for bit, its
// recomputation giving no checkpointing's gradients.
TEST(SwinUnetr, FasterFormIsTheLeanOneToRounding) {
  const tier_test::VolumeBatch batch(1, {1, 32, 32, 64});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  const auto net = swin();
  ASSERT_TRUE(net->has_lean_form());
  const Step lean = tier_test::step(*net, Tier::kOff, x, loss);
  net->set_memory_lean(false);
  const Step faster = tier_test::step(*net, Tier::kOff, x, loss);
  const Step faster_all = tier_test::step(*net, Tier::kAll, x, loss);
  net->set_memory_lean(true);
  // The recomputation in backward takes the faster form too: the
  // gradients are no checkpointing's to the tier test's 1e-6 above.
  EXPECT_TRUE(torch::equal(faster.out, faster_all.out));
  for (const auto& [name, g] : faster.grads) {
    EXPECT_LE(
        (g - faster_all.grads.at(name)).abs().max().item<double>(),
        1e-6 * g.abs().max().item<double>() + 1e-9)
        << name;
  }
  const double out_scale = lean.out.abs().max().item<double>();
  EXPECT_LE(
      (faster.out - lean.out).abs().max().item<double>(), 1e-5 * out_scale);
  // Two float32 attentions summing in other orders, carried through the
  // network: bounded against the largest gradient of the model (a tensor
  // whose gradients are all small differs by more of its own).
  double scale = 0, worst = 0;
  for (const auto& [name, g] : lean.grads)
    scale = std::max(scale, g.abs().max().item<double>());
  for (const auto& [name, g] : lean.grads) {
    const double d = (g - faster.grads.at(name)).abs().max().item<double>();
    EXPECT_LE(d, 1e-5 * scale) << name;
    worst = std::max(worst, d);
  }
  std::printf(
      "faster vs lean form: gradients within %.2g of the largest, %.3g\n",
      worst / scale,
      scale);
  EXPECT_GT(faster.peak, lean.peak);
  EXPECT_LT(faster_all.peak, faster.peak);
}

// bf16 autocast (CPU): the layer norms run in float32, as CUDA's autocast
// runs them (LibTorch 1.13 threw on a bfloat16 input with float32
// weights); the logits stay near fp32's, checkpointed or not, and the
// gradients are finite. The patch is 96 deep: at a depth of 32 or 64 some
// 3x3x3 convolution sees a depth of 2, where LibTorch 2.x's oneDNN bf16
// weight gradient reads uninitialized memory (Note [A oneDNN bf16
// gradient bug]; the trainer refuses such runs: BfloatConvolutionsOnCpu).
TEST(SwinUnetr, Bf16AutocastTrains) {
  const tier_test::VolumeBatch batch(2, {1, 96, 32, 32});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  const auto net = swin();
  const Step fp32 = tier_test::step(*net, Tier::kOff, x, loss);
  for (const Tier t : {Tier::kOff, Tier::kAll}) {
    const Step s = tier_test::step(*net, t, x, loss, /*bf16=*/true);
    EXPECT_LE(
        (s.out.to(torch::kFloat32) - fp32.out).abs().max().item<double>(),
        0.05 * fp32.out.abs().max().item<double>());
    for (const auto& [name, g] : s.grads)
      EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << name;
  }
}

// Where LibTorch 2.x's CPU bf16 convolution gradient is wrong, training
// is refused at start-up; under 1.13 (correct there) it is not.
TEST(SwinUnetr, BfloatConvolutionsOnCpu) {
  TrainConfig cfg;
  cfg.model.name = ModelName::kSwinUnetr;
  cfg.training.amp = Amp::kBf16;
  cfg.data.patch_size = {64, 32, 32};
  const std::string m =
      test::error_of([&] { check_cpu_bf16_convolutions(cfg, true); });
  if (MEMTRAIN_TORCH_AT_LEAST(2, 0)) {
    EXPECT_NE(
        m.find("data.patch_size depth 64 is 2 voxels at 1/32 of the patch"),
        std::string::npos)
        << m;
  } else {
    EXPECT_EQ(m, "");
  }
  cfg.data.patch_size = {96, 32, 32};
  EXPECT_EQ(
      test::error_of([&] { check_cpu_bf16_convolutions(cfg, true); }), "");
  cfg.data.patch_size = {32, 32, 64};
  EXPECT_EQ(
      test::error_of([&] { check_cpu_bf16_convolutions(cfg, false); }), "");
  cfg.training.amp = Amp::kOff;
  EXPECT_EQ(
      test::error_of([&] { check_cpu_bf16_convolutions(cfg, true); }), "");
  cfg.model.name = ModelName::kUnet3d;
  cfg.model.depth = 3;
  cfg.data.patch_size = {8, 32, 32};
  cfg.training.amp = Amp::kBf16;
  EXPECT_EQ(
      test::error_of([&] { check_cpu_bf16_convolutions(cfg, true); }).empty(),
      !MEMTRAIN_TORCH_AT_LEAST(2, 0));
}

TEST(SwinUnetr, RefusesWhatMonaiRefuses) {
  std::string m = test::error_of([] { swin(16); });
  EXPECT_NE(m.find("needs a multiple of 12"), std::string::npos) << m;
  const auto net = swin();
  m = test::error_of([&] { net->forward(torch::zeros({1, 1, 32, 32, 48})); });
  EXPECT_NE(m.find("multiples of 32"), std::string::npos) << m;
  m = test::error_of([&] { net->forward(torch::zeros({1, 1, 32, 32, 32})); });
  EXPECT_NE(m.find("one voxel at 1/32"), std::string::npos) << m;
  m = test::error_of([&] { net->forward(torch::zeros({1, 2, 32, 32, 64})); });
  EXPECT_NE(m.find("expected an input (N, 1, D, H, W)"), std::string::npos)
      << m;
}

}  // namespace
}  // namespace memtrain
