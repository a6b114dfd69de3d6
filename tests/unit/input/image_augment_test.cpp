// Image augmentation (Note [Image augmentation]): the crop/flip draw is a
// pure function of (seed, epoch, index) inside its ranges, the flip is
// fair; applying it = the identity, a mirror, torch's own crop +
// interpolate and a hand-written bilinear resize; normalisation =
// (x - mean) / std; a batch's samples do not depend on each other; the
// config's auto rules and refusals.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/input/image_augment.h"
#include "test_support.h"

namespace memtrain {
namespace {

ImageTransform crop_flip(uint64_t seed = 7) {
  ImageTransform t;
  t.crop = true;
  t.flip = true;
  t.seed = seed;
  return t;
}

TEST(ImageAugment, DrawIsAFunctionOfSeedEpochAndIndex) {
  const ImageTransform t = crop_flip();
  int differ = 0;
  for (int64_t i = 0; i < 100; ++i) {
    const CropDraw a = draw_crop(t, 32, 48, 3, i);
    EXPECT_EQ(a, draw_crop(t, 32, 48, 3, i)) << i;
    differ += a == draw_crop(t, 32, 48, 3, i + 1) ? 0 : 1;
  }
  EXPECT_EQ(differ, 100);  // another index, another draw
  EXPECT_FALSE(draw_crop(t, 32, 48, 3, 5) == draw_crop(t, 32, 48, 4, 5));
  EXPECT_FALSE(
      draw_crop(t, 32, 48, 3, 5) == draw_crop(crop_flip(8), 32, 48, 3, 5));
}

TEST(ImageAugment, BoxesStayInTheImageAndTheRanges) {
  ImageTransform t = crop_flip();
  t.scale = {0.2, 0.7};
  t.ratio = {0.5, 1.5};
  const int64_t H = 24, W = 40;
  const double area = H * W;
  bool moved = false;
  for (int64_t i = 0; i < 5000; ++i) {
    const CropDraw d = draw_crop(t, H, W, 1, i);
    ASSERT_GE(d.top, 0);
    ASSERT_GE(d.left, 0);
    ASSERT_GT(d.height, 0);
    ASSERT_GT(d.width, 0);
    ASSERT_LE(d.top + d.height, H);
    ASSERT_LE(d.left + d.width, W);
    // w and h are rounded: within half a pixel of a box in the ranges.
    const double w = d.width, h = d.height;
    EXPECT_GE((w + 0.5) * (h + 0.5), t.scale[0] * area) << i;
    EXPECT_LE((w - 0.5) * (h - 0.5), t.scale[1] * area) << i;
    EXPECT_GE((w + 0.5) / (h - 0.5), t.ratio[0]) << i;
    EXPECT_LE((w - 0.5) / (h + 0.5), t.ratio[1]) << i;
    moved = moved || d.top != draw_crop(t, H, W, 1, 0).top;
  }
  EXPECT_TRUE(moved);
}

TEST(ImageAugment, FallbackIsTheCentreCropClampedToTheRatio) {
  ImageTransform t = crop_flip();
  t.flip = false;
  t.scale = {1.0, 1.0};
  t.ratio = {2.0, 2.0};  // w = 23 > 16 at every attempt
  const CropDraw d = draw_crop(t, 16, 16, 0, 3);
  EXPECT_EQ(d, (CropDraw{4, 0, 8, 16, false}));
  t.ratio = {1.0, 1.0};  // the whole image
  EXPECT_EQ(draw_crop(t, 16, 16, 0, 3), (CropDraw{0, 0, 16, 16, false}));
  ImageTransform none;
  EXPECT_EQ(draw_crop(none, 16, 12, 0, 3), (CropDraw{0, 0, 16, 12, false}));
}

TEST(ImageAugment, FlipIsFair) {
  ImageTransform t;
  t.flip = true;
  t.seed = 11;
  int flips = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    const CropDraw d = draw_crop(t, 8, 8, 2, i);
    EXPECT_EQ(d.height, 8);  // no crop without t.crop
    flips += d.flip ? 1 : 0;
  }
  // Binomial(2000, 1/2): sd 22.4; 5 sd either side.
  EXPECT_NEAR(flips, 1000, 112);
}

TEST(ImageAugment, WholeBoxIsTheIdentityAndFlipMirrors) {
  torch::manual_seed(1);
  const at::Tensor x = torch::rand({3, 10, 14});
  const at::Tensor same = crop_and_flip(x, {0, 0, 10, 14, false});
  EXPECT_LE((same - x).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(torch::equal(crop_and_flip(x, {0, 0, 10, 14, true}), x.flip(-1)));
}

// Bilinear resize of a (C, h, w) crop to (C, H, W), align_corners=false,
// written out in double: src = (dst + 0.5) in / out - 0.5, clamped at 0.
at::Tensor hand_bilinear(const at::Tensor& crop, int64_t H, int64_t W) {
  const auto c = crop.to(torch::kFloat64).contiguous();
  const int64_t C = c.size(0), h = c.size(1), w = c.size(2);
  at::Tensor out = torch::zeros({C, H, W}, torch::kFloat64);
  auto a = c.accessor<double, 3>();
  auto o = out.accessor<double, 3>();
  auto src = [](int64_t d, int64_t in, int64_t n) {
    return std::max(0.0, (d + 0.5) * double(in) / double(n) - 0.5);
  };
  for (int64_t y = 0; y < H; ++y) {
    const double sy = src(y, h, H);
    const int64_t y0 = static_cast<int64_t>(sy), y1 = std::min(y0 + 1, h - 1);
    const double ly = sy - y0;
    for (int64_t x = 0; x < W; ++x) {
      const double sx = src(x, w, W);
      const int64_t x0 = static_cast<int64_t>(sx), x1 = std::min(x0 + 1, w - 1);
      const double lx = sx - x0;
      for (int64_t k = 0; k < C; ++k) {
        o[k][y][x] = (1 - ly) * ((1 - lx) * a[k][y0][x0] + lx * a[k][y0][x1]) +
                     ly * ((1 - lx) * a[k][y1][x0] + lx * a[k][y1][x1]);
      }
    }
  }
  return out;
}

TEST(ImageAugment, CropIsTorchsCropAndInterpolate) {
  torch::manual_seed(2);
  const at::Tensor x = torch::rand({3, 16, 20});
  const CropDraw box{3, 5, 10, 7, true};
  const at::Tensor got = crop_and_flip(x, box);
  ASSERT_EQ(got.sizes(), x.sizes());
  const at::Tensor crop = x.slice(1, 3, 13).slice(2, 5, 12);
  namespace F = torch::nn::functional;
  const at::Tensor torch_ref = F::interpolate(
                                   crop.unsqueeze(0),
                                   F::InterpolateFuncOptions()
                                       .size(std::vector<int64_t>{16, 20})
                                       .mode(torch::kBilinear)
                                       .align_corners(false))
                                   .squeeze(0)
                                   .flip(-1);
  EXPECT_LE((got - torch_ref).abs().max().item<double>(), 1e-5);
  const at::Tensor hand = hand_bilinear(crop, 16, 20).flip(-1);
  EXPECT_LE((got.to(torch::kFloat64) - hand).abs().max().item<double>(), 1e-5);
}

TEST(ImageAugment, NormalisationIsImagenetMeanAndStd) {
  torch::manual_seed(3);
  const at::Tensor x = torch::rand({2, 3, 4, 5});
  at::Tensor y = x.clone();
  normalize_imagenet(y);
  const at::Tensor mean = torch::tensor({0.485, 0.456, 0.406}).view({3, 1, 1});
  const at::Tensor std = torch::tensor({0.229, 0.224, 0.225}).view({3, 1, 1});
  EXPECT_TRUE(torch::equal(y, (x - mean) / std));
  // And in double, per channel.
  for (int64_t c = 0; c < 3; ++c) {
    const at::Tensor want =
        (x.select(1, c).to(torch::kFloat64) - kImagenetMean[c]) /
        kImagenetStd[c];
    EXPECT_LE(
        (y.select(1, c).to(torch::kFloat64) - want).abs().max().item<double>(),
        1e-6);
  }
}

TEST(ImageAugment, BatchSamplesAreTransformedOnTheirOwn) {
  ImageTransform t = crop_flip(5);
  t.normalize = true;
  torch::manual_seed(4);
  const at::Tensor rows = torch::rand({4, 3, 12, 12});
  at::Tensor batch = rows.clone();
  const std::vector<int64_t> ids = {40, 7, 13, 2};
  transform_images(t, 6, ids, batch);
  for (size_t k = 0; k < ids.size(); ++k) {
    at::Tensor one = rows.narrow(0, static_cast<int64_t>(k), 1).clone();
    transform_images(t, 6, {ids[k]}, one);  // alone, in a batch of one
    EXPECT_TRUE(torch::equal(one[0], batch[static_cast<int64_t>(k)])) << k;
    at::Tensor by_hand = crop_and_flip(
        rows[static_cast<int64_t>(k)], draw_crop(t, 12, 12, 6, ids[k]));
    normalize_imagenet(by_hand);
    EXPECT_TRUE(torch::equal(by_hand, batch[static_cast<int64_t>(k)])) << k;
  }
  at::Tensor other_epoch = rows.clone();
  transform_images(t, 7, ids, other_epoch);
  EXPECT_FALSE(torch::equal(other_epoch, batch));
}

DatasetInfo images_info(int64_t channels) {
  DatasetInfo info;
  info.path = "x.h5";
  info.kind = SampleKind::kImages;
  info.sample_shape = {channels, 8, 8};
  return info;
}

TEST(ImageAugment, AutoRulesAndRefusals) {
  TrainConfig cfg;
  cfg.data.seed = 9;
  cfg.model.name = ModelName::kResnet50;
  ImageTransforms r = resolve_image_transforms(cfg, images_info(3), false);
  EXPECT_TRUE(r.train.crop && r.train.flip && r.train.normalize);
  EXPECT_TRUE(r.val.normalize && !r.val.augments());
  EXPECT_EQ(r.train.seed, 9u);
  EXPECT_EQ(
      r.train.describe(),
      "crop_flip (scale [0.08, 1], ratio [0.75, 1.33333]), normalize "
      "imagenet");
  r = resolve_image_transforms(cfg, images_info(1), false);  // gray
  EXPECT_TRUE(r.train.crop && !r.train.normalize);
  r = resolve_image_transforms(cfg, images_info(3), true);  // episodes
  EXPECT_FALSE(r.train.active() || r.val.active());
  cfg.model.name = ModelName::kCnn;
  r = resolve_image_transforms(cfg, images_info(3), false);
  EXPECT_FALSE(r.train.active() || r.val.active());
  cfg.data.augment = Augment::kFlip;
  r = resolve_image_transforms(cfg, images_info(3), false);
  EXPECT_TRUE(r.train.flip && !r.train.crop && !r.train.normalize);

  cfg.data.normalize = Normalize::kImagenet;
  EXPECT_NE(
      test::error_of(
          [&] { resolve_image_transforms(cfg, images_info(1), false); })
          .find("needs 3-channel (RGB) images, but the images of data.train "
                "'x.h5' have 1 channel(s)"),
      std::string::npos);
  DatasetInfo features;
  features.path = "f.h5";
  features.sample_shape = {16};
  cfg.data.normalize = Normalize::kNone;
  cfg.data.augment = Augment::kCropFlip;
  EXPECT_NE(
      test::error_of([&] { resolve_image_transforms(cfg, features, false); })
          .find("data.augment=crop_flip applies to /images files, but "
                "data.train 'f.h5' holds features"),
      std::string::npos);
  cfg.data.augment = Augment::kAuto;
  cfg.model.name = ModelName::kResnet50;  // auto on features: none
  EXPECT_FALSE(resolve_image_transforms(cfg, features, false).train.active());
}

TEST(ImageAugment, ConfigKeys) {
  TrainConfig c = TrainConfig::load(
      "",
      {"data.augment=crop_flip",
       "data.crop_scale=[0.25, 0.5]",
       "data.crop_ratio=[0.5, 2]",
       "data.normalize=imagenet",
       "training.label_smoothing=0.1",
       "validation.best_metric=val_auc"});
  EXPECT_EQ(c.data.crop_scale, (std::array<double, 2>{0.25, 0.5}));
  EXPECT_EQ(c.data.crop_ratio, (std::array<double, 2>{0.5, 2.0}));
  EXPECT_NE(c.to_yaml().find("crop_scale: [0.25, 0.5]"), std::string::npos);
  EXPECT_NE(
      TrainConfig{}.to_yaml().find("crop_ratio: [0.75, 1.3333333333333333]"),
      std::string::npos);
  for (const char* bad :
       {"data.crop_scale=[0.9, 0.2]",
        "data.crop_scale=[0, 1]",
        "data.crop_scale=[0.5, 1.5]",
        "data.crop_ratio=[-1, 2]",
        "data.crop_ratio=0.5",
        "data.augment=crop",
        "data.normalize=yes",
        "training.label_smoothing=1",
        "training.label_smoothing=-0.1"}) {
    EXPECT_NE(test::error_of([&] { TrainConfig::load("", {bad}); }), "") << bad;
  }
  EXPECT_NE(
      test::error_of([&] {
        TrainConfig::load("", {"data.crop_scale=[0.9, 0.2]"});
      }).find("lo is above hi"),
      std::string::npos);
  const std::string help = TrainConfig::describe_keys();
  for (const char* key :
       {"--data.augment",
        "--data.crop_scale",
        "--data.crop_ratio",
        "--data.normalize",
        "--training.label_smoothing"})
    EXPECT_NE(help.find(key), std::string::npos) << key;
}

}  // namespace
}  // namespace memtrain
