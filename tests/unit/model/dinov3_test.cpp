// Meta's DINOv3 ViT (model/blocks/dinov3_vit.h): its sizes, its RoPE, its
// names and its features' shapes. Its values against timm's and Meta's own
// code: tests/e2e/dinov3_timm.sh.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/config/train_config.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/blocks/dinov3_vit.h"
#include "memtrain/model/nets/dinov3_seg.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {
namespace {

TEST(Dinov3, SizesAreMetasAndOthersAreRefusedNamed) {
  const Dinov3Spec s = dinov3_spec("vits16");
  EXPECT_EQ(s.dim, 384);
  EXPECT_EQ(s.depth, 12);
  EXPECT_EQ(s.heads, 6);
  EXPECT_EQ(s.layers, (std::vector<int64_t>{2, 5, 8, 11}));
  const Dinov3Spec b = dinov3_spec("vitb16");
  EXPECT_EQ(b.dim, 768);
  EXPECT_EQ(b.heads, 12);
  EXPECT_EQ(b.layers, (std::vector<int64_t>{2, 5, 8, 11}));
  EXPECT_EQ(dinov3_spec("tiny").layers, (std::vector<int64_t>{0, 1, 2, 3}));
  try {
    dinov3_spec("vitl16");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("'vitl16' is not a DINOv3 size memtrain "
                                   "has (vits16, vitb16, tiny"),
        std::string::npos)
        << e.what();
  }
}

TEST(Dinov3, PeriodsAreBaseToTheFourJOverE) {
  const Dinov3Rope rope(64, 100.0);
  const torch::Tensor p = rope.periods();
  ASSERT_EQ(p.sizes(), torch::IntArrayRef({16}));
  EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  for (int64_t j = 0; j < 16; ++j)
    EXPECT_NEAR(
        p[j].item<float>(),
        std::pow(100.0, j / 16.0),
        1e-5 * p[j].item<float>());
  EXPECT_NEAR(p[1].item<float>(), 1.3335215f, 1e-6);
  EXPECT_NEAR(p[15].item<float>(), 74.98942f, 1e-4);
}

TEST(Dinov3, RopeAnglesArePatchCentresInMinusOneToOnePerAxis) {
  const Dinov3Rope rope(8, 100.0);  // F = 2 periods: 1 and 10
  const auto [sin, cos] = rope.sincos(2, 1);
  ASSERT_EQ(sin.sizes(), torch::IntArrayRef({2, 8}));
  // Row 0 of 2 sits at y = -0.5, row 1 at 0.5; one column at x = 0.
  // theta = [y/1, y/10, x/1, x/10] * 2 pi, twice.
  const double pi = M_PI;
  const std::vector<double> y{-0.5, 0.5};
  for (int64_t r = 0; r < 2; ++r) {
    for (int64_t half = 0; half < 2; ++half) {
      EXPECT_NEAR(
          sin[r][4 * half + 0].item<float>(), std::sin(2 * pi * y[r]), 1e-6);
      EXPECT_NEAR(
          sin[r][4 * half + 1].item<float>(),
          std::sin(2 * pi * y[r] / 10),
          1e-6);
      EXPECT_NEAR(
          cos[r][4 * half + 1].item<float>(),
          std::cos(2 * pi * y[r] / 10),
          1e-6);
      EXPECT_EQ(sin[r][4 * half + 2].item<float>(), 0.0f);
      EXPECT_EQ(cos[r][4 * half + 3].item<float>(), 1.0f);
    }
  }
}

TEST(Dinov3, RopeRotatesHalvesAndLeavesThePrefixTokens) {
  // sin 1, cos 0: the rotation is rotate_half, [a, b] -> [-b, a].
  const torch::Tensor x = torch::arange(12, torch::kFloat32).view({1, 1, 2, 6});
  const torch::Tensor out =
      dinov3_rope_apply(x, torch::ones({1, 6}), torch::zeros({1, 6}));
  EXPECT_TRUE(torch::equal(out[0][0][0], x[0][0][0]));  // the prefix row
  EXPECT_TRUE(torch::equal(
      out[0][0][1], torch::tensor({-9.f, -10.f, -11.f, 6.f, 7.f, 8.f})));
}

TEST(Dinov3, RopeScoresDependOnTheOffsetOnly) {
  // A row of 4 patches: q at 0 against k at 1 scores as q at 2 against k
  // at 3 (the rotation pairs dimension i with i + E/2 at one angle).
  torch::manual_seed(1);
  const Dinov3Rope rope(16, 100.0);
  const auto [sin, cos] = rope.sincos(1, 4);
  const torch::Tensor q = torch::randn({16}).expand({4, 16}).contiguous();
  const torch::Tensor k = torch::randn({16}).expand({4, 16}).contiguous();
  const torch::Tensor rq = dinov3_rope_apply(q, sin, cos);
  const torch::Tensor rk = dinov3_rope_apply(k, sin, cos);
  const float a = (rq[0] * rk[1]).sum().item<float>();
  const float b = (rq[2] * rk[3]).sum().item<float>();
  const float c = (rq[0] * rk[2]).sum().item<float>();
  EXPECT_NEAR(a, b, 1e-5);
  EXPECT_GT(std::abs(a - c), 1e-3);  // another offset, another score
  // A rotation: the norms stay.
  EXPECT_NEAR(rq[3].norm().item<float>(), q[3].norm().item<float>(), 1e-5);
}

TEST(Dinov3, StateIsMetasStateDictLessTheMaskToken) {
  Dinov3Vit m(dinov3_spec("tiny"));
  std::vector<std::string> names;
  for (const auto& [name, t] : state_tensors(m))
    names.push_back(name);
  const std::vector<std::string> head{
      "cls_token",
      "storage_tokens",
      "patch_embed.proj.weight",
      "patch_embed.proj.bias",
      "rope_embed.periods",
      "blocks.0.norm1.weight",
      "blocks.0.norm1.bias",
      "blocks.0.attn.qkv.weight",
      "blocks.0.attn.qkv.bias",
      "blocks.0.attn.qkv.bias_mask",
      "blocks.0.attn.proj.weight",
      "blocks.0.attn.proj.bias",
      "blocks.0.ls1.gamma",
      "blocks.0.norm2.weight",
      "blocks.0.norm2.bias",
      "blocks.0.mlp.fc1.weight",
      "blocks.0.mlp.fc1.bias",
      "blocks.0.mlp.fc2.weight",
      "blocks.0.mlp.fc2.bias",
      "blocks.0.ls2.gamma",
      "blocks.1.norm1.weight"};
  ASSERT_EQ(names.size(), 5u + 4 * 15 + 2);
  EXPECT_EQ(std::vector<std::string>(names.begin(), names.begin() + 21), head);
  EXPECT_EQ(names[names.size() - 2], "norm.weight");
  EXPECT_EQ(names.back(), "norm.bias");
  // bias_mask [1, 0, 1] as Meta's init_weights sets it.
  const torch::Tensor mask = state_tensors(m)[9].second;
  EXPECT_EQ(mask.sum().item<float>(), 128.0f);
  EXPECT_EQ(mask.narrow(0, 64, 64).abs().sum().item<float>(), 0.0f);
}

TEST(Dinov3, ParameterCountsAreMetas) {
  // Meta's ViT-S/16 and ViT-B/16 less mask_token (384 and 768).
  auto count = [](const std::string& v) {
    Dinov3Vit m(dinov3_spec(v));
    int64_t n = 0;
    for (const auto& p : m.parameters())
      n += p.numel();
    return n;
  };
  EXPECT_EQ(count("vits16"), 21600768);
  EXPECT_EQ(count("vitb16"), 85668864);
}

TEST(Dinov3, FeaturesAreMapsOfThePatchGridAndTheKeyBiasIsMasked) {
  torch::manual_seed(2);
  Dinov3Vit m(dinov3_spec("tiny"));
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    p.add_(0.05 * torch::randn_like(p));
  const torch::Tensor x = torch::randn({2, 3, 64, 80});
  const Dinov3Features f = m.forward_features(x, {1, 3});
  ASSERT_EQ(f.maps.size(), 2u);
  EXPECT_EQ(f.maps[1].sizes(), torch::IntArrayRef({2, 64, 4, 5}));
  EXPECT_EQ(f.cls[0].sizes(), torch::IntArrayRef({2, 64}));
  // The key part of the qkv bias never counts.
  for (const auto& [name, t] : state_tensors(m))
    if (name.find("qkv.bias") != std::string::npos &&
        name.find("mask") == std::string::npos)
      t.narrow(0, 64, 64).add_(torch::randn({64}));
  const Dinov3Features g = m.forward_features(x, {1, 3});
  EXPECT_TRUE(torch::allclose(f.maps[1], g.maps[1], 0, 1e-6));
  EXPECT_TRUE(torch::allclose(f.cls[1], g.cls[1], 0, 1e-6));
  // The value part does.
  for (const auto& [name, t] : state_tensors(m))
    if (name == "blocks.0.attn.qkv.bias")
      t.narrow(0, 128, 64).add_(1.0);
  const Dinov3Features h = m.forward_features(x, {1});
  EXPECT_FALSE(torch::allclose(f.maps[0], h.maps[0], 0, 1e-3));
}

TEST(Dinov3, AnImageNotOfWholePatchesIsRefused) {
  Dinov3Vit m(dinov3_spec("tiny"));
  torch::NoGradGuard no_grad;
  try {
    m.forward_features(torch::zeros({1, 3, 250, 256}), {0});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "an image of 250x256 is not a multiple of the 16-pixel patch"),
        std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.forward_features(torch::zeros({1, 3, 32, 32}), {2, 1}), Error);
  EXPECT_THROW(m.forward_features(torch::zeros({1, 3, 32, 32}), {4}), Error);
}

void copy_state(torch::nn::Module& to, const torch::nn::Module& from) {
  torch::NoGradGuard no_grad;
  const NamedTensors a = state_tensors(to), b = state_tensors(from);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    a[i].second.copy_(b[i].second);
}

std::shared_ptr<Classifier> segmenter(
    std::vector<int64_t> shape,
    int64_t axis,
    int64_t chunk,
    double context = 0.0,
    Fusion fusion = Fusion::kConcat) {
  ModelConfig cfg;
  cfg.name = ModelName::kDinov3;
  cfg.variant = "tiny";
  cfg.slice_axis = axis;
  cfg.slice_chunk = chunk;
  cfg.context.scale = context;
  cfg.context.fusion = fusion;
  ModelInput in;
  in.kind = SampleKind::kVolumes;
  in.sample_shape = std::move(shape);
  in.num_classes = 3;
  return make_model(cfg, in);
}

TEST(Dinov3Segmenter, SlicesAcrossTheAxisAndStacksTheLogitsBack) {
  torch::manual_seed(4);
  auto m = segmenter({1, 5, 32, 48}, 0, 0);
  const torch::Tensor x = torch::randn({2, 1, 5, 32, 48});
  const torch::Tensor y = m->forward(x);
  ASSERT_EQ(y.sizes(), torch::IntArrayRef({2, 3, 5, 32, 48}));
  // Slice 3 of volume 1 alone gives the same logits: slices are
  // independent and go back where they came from.
  const torch::Tensor one = m->forward(x.narrow(0, 1, 1).narrow(2, 3, 1));
  EXPECT_TRUE(
      torch::allclose(one[0].select(1, 0), y[1].select(1, 3), 1e-5, 1e-5));
  // Chunks of 3 slices give the logits of all 10 at once (to rounding:
  // the matrix products see other batch sizes).
  auto chunked = segmenter({1, 5, 32, 48}, 0, 3);
  copy_state(*chunked, *m);
  EXPECT_TRUE(torch::allclose(chunked->forward(x), y, 1e-5, 1e-6));
  // Across H and across W: the other two sides are the slice.
  auto across_h = segmenter({1, 32, 5, 48}, 1, 0);
  const torch::Tensor xh = x.permute({0, 1, 3, 2, 4}).contiguous();
  copy_state(*across_h, *m);
  EXPECT_TRUE(torch::allclose(
      across_h->forward(xh), y.permute({0, 1, 3, 2, 4}), 1e-5, 1e-5));
  auto across_w = segmenter({1, 32, 48, 5}, 2, 0);
  const torch::Tensor xw = x.permute({0, 1, 3, 4, 2}).contiguous();
  copy_state(*across_w, *m);
  EXPECT_TRUE(torch::allclose(
      across_w->forward(xw), y.permute({0, 1, 3, 4, 2}), 1e-5, 1e-5));
}

TEST(Dinov3Segmenter, OnlyTheHeadTrains) {
  auto m = segmenter({1, 2, 16, 16}, 0, 0);
  int64_t trained = 0, frozen = 0;
  for (const auto& p : m->named_parameters()) {
    if (p.value().requires_grad()) {
      EXPECT_EQ(p.key().rfind("head.", 0), 0u) << p.key();
      trained += p.value().numel();
    } else {
      EXPECT_EQ(p.key().rfind("backbone.", 0), 0u) << p.key();
      frozen += p.value().numel();
    }
  }
  EXPECT_EQ(trained, 4 * 64 * 3 + 3);  // a 1x1 conv from 4 layers of 64
  m->train();
  m->forward(torch::randn({1, 1, 2, 16, 16})).sum().backward();
  for (const auto& p : m->named_parameters())
    EXPECT_EQ(p.value().grad().defined(), p.value().requires_grad()) << p.key();
  EXPECT_GT(frozen, 0);
  // A volume of 2 channels is refused, named.
  EXPECT_THROW(segmenter({2, 2, 16, 16}, 0, 0), Error);
}

// model.context: the same backbone on the context crops, fused. A concat
// head whose context half is zero, and an add whose context weights are
// zero, are the patch's own model; an add of the patch with itself at
// weights 1/2 and 1/2 too. Only the head and the add's weights train.
TEST(Dinov3Segmenter, ContextIsFusedAfterTheSameBackbone) {
  torch::manual_seed(5);
  auto plain = segmenter({1, 3, 32, 16}, 0, 0);
  const torch::Tensor x = torch::randn({2, 1, 3, 32, 16});
  const torch::Tensor c = torch::randn({2, 1, 3, 32, 16});
  const torch::Tensor y = plain->forward(x);
  auto concat = segmenter({1, 3, 32, 16}, 0, 0, 2.0, Fusion::kConcat);
  auto add = segmenter({1, 3, 32, 16}, 0, 0, 2.0, Fusion::kAdd);
  {
    torch::NoGradGuard no_grad;
    for (auto* m : {concat.get(), add.get()}) {
      for (const auto& p : m->named_parameters()) {
        if (p.key().rfind("backbone.", 0) == 0)
          p.value().copy_(plain->named_parameters()[p.key()]);
      }
      m->named_parameters()["head.bias"].copy_(
          plain->named_parameters()["head.bias"]);
    }
    const torch::Tensor w = plain->named_parameters()["head.weight"];
    concat->named_parameters()["head.weight"].copy_(
        torch::cat({w, torch::zeros_like(w)}, 1));
    add->named_parameters()["head.weight"].copy_(w);
    add->named_parameters()["fuse"][1].zero_();
  }
  EXPECT_TRUE(torch::allclose(concat->forward(x, c), y, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(add->forward(x, c), y, 1e-5, 1e-6));
  {
    torch::NoGradGuard no_grad;
    add->named_parameters()["fuse"].fill_(0.5);
  }
  EXPECT_TRUE(torch::allclose(add->forward(x, x), y, 1e-5, 1e-6));
  // The context changes the output where its half of the head is not 0.
  {
    torch::NoGradGuard no_grad;
    add->named_parameters()["fuse"][1].fill_(1.0);
  }
  EXPECT_FALSE(torch::allclose(add->forward(x, c), y, 1e-3, 1e-3));
  // A context model without its context is refused.
  EXPECT_THROW(concat->forward(x), Error);
  // What trains: the head (twice the inputs under concat) and fuse.
  for (const auto& [m, expected] :
       {std::pair{concat, int64_t{2 * 4 * 64 * 3 + 3}},
        std::pair{add, int64_t{4 * 64 * 3 + 3 + 2 * 4 * 64}}}) {
    int64_t trained = 0;
    for (const auto& p : m->named_parameters()) {
      if (p.value().requires_grad())
        trained += p.value().numel();
      else
        EXPECT_EQ(p.key().rfind("backbone.", 0), 0u) << p.key();
    }
    EXPECT_EQ(trained, expected);
  }
}

// Each extraction's device peak is measured on its own (the window
// record's mem_peak_backbone and mem_peak_context), and leaves the peak
// everyone else reads as it was.
TEST(Dinov3Segmenter, TheExtractionsPeaksAreItsOwn) {
  torch::manual_seed(6);
  auto m = segmenter({1, 4, 32, 32}, 0, 0, 2.0, Fusion::kConcat);
  EXPECT_TRUE(m->take_phase_peaks().empty());
  memory::DeviceScope device;
  const torch::Tensor x = torch::randn({2, 1, 4, 32, 32});
  const torch::Tensor c = torch::randn({2, 1, 4, 32, 32});
  {
    torch::NoGradGuard no_grad;  // first-call caches, before measuring
    m->forward(x, c);
    (void)m->take_phase_peaks();
  }
  memory::reset_peak();
  torch::Tensor big = torch::empty({64 << 20}, torch::kUInt8);  // 64 MiB
  big.reset();
  const int64_t before = memory::stats().peak_allocated;
  {
    torch::NoGradGuard no_grad;
    m->forward(x, c);
  }
  EXPECT_EQ(memory::stats().peak_allocated, before);  // the 64 MiB's
  const auto peaks = m->take_phase_peaks();
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_EQ(peaks[0].first, "backbone");
  EXPECT_EQ(peaks[1].first, "context");
  for (const auto& [phase, bytes] : peaks) {
    EXPECT_GT(bytes, memory::stats().allocated) << phase;
    EXPECT_LT(bytes, before) << phase;
  }
  // The context's extraction runs beside the patch's features: 8 slices x
  // 4 layers x 64 x 2 x 2 floats more.
  EXPECT_EQ(peaks[1].second - peaks[0].second, 8 * 4 * 64 * 2 * 2 * 4);
  EXPECT_TRUE(m->take_phase_peaks().empty());  // taken
}

// Under AMP the features are kept in the compute dtype: the patch's maps
// the context's extraction runs beside are bfloat16, half the float32
// bytes above, and the head's logits equal float32's within bfloat16's
// rounding.
TEST(Dinov3Segmenter, FeaturesAreKeptInTheComputeDtype) {
  torch::manual_seed(6);
  auto m = segmenter({1, 4, 32, 32}, 0, 0, 2.0, Fusion::kConcat);
  memory::DeviceScope device;
  const torch::Tensor x = torch::randn({2, 1, 4, 32, 32});
  const torch::Tensor c = torch::randn({2, 1, 4, 32, 32});
  torch::NoGradGuard no_grad;
  const torch::Tensor fp32 = m->forward(x, c);
  (void)m->take_phase_peaks();
  compat::AutocastGuard amp(true, false, torch::kBFloat16);
  const torch::Tensor bf16 = m->forward(x, c);
  const auto peaks = m->take_phase_peaks();
  ASSERT_EQ(peaks.size(), 2u);
  EXPECT_EQ(peaks[1].second - peaks[0].second, 8 * 4 * 64 * 2 * 2 * 2);
  EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);
  const double scale = fp32.abs().max().item<double>();
  EXPECT_LT(
      (bf16.to(torch::kFloat) - fp32).abs().max().item<double>(), 0.05 * scale);
}

}  // namespace
}  // namespace memtrain
