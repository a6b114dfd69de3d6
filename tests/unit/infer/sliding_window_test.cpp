// Sliding-window inference: window placement, blending, padding, and the
// point of the feature -- with offload_cpu the device peak does not grow
// with the volume.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/infer/sliding_window.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

std::shared_ptr<Classifier> small_unet(int64_t in, int64_t classes) {
  ModelConfig cfg;
  cfg.name = ModelName::kUnet3d;
  cfg.depth = 2;
  cfg.norm = Norm::kInstance;
  cfg.feature_size = 4;
  torch::manual_seed(static_cast<uint64_t>(cfg.seed));
  auto net = make_unet3d(cfg, in, classes);
  net->eval();
  return net;
}

// Softmax of the predictor on the whole volume: what every window agrees
// with when the predictor is pointwise.
torch::Tensor whole_volume_probs(
    const PatchPredictor& predict, const torch::Tensor& volume) {
  torch::NoGradGuard no_grad;
  return torch::softmax(
             predict(volume.unsqueeze(0), at::Tensor(), at::Tensor()), 1)
      .squeeze(0);
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

TEST(SlidingWindow, WindowStartsCoverTheAxisExactly) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(window_starts(16, 8, 0.5), (V{0, 4, 8}));
  EXPECT_EQ(window_starts(10, 4, 0.25), (V{0, 3, 6}));
  EXPECT_EQ(window_starts(11, 4, 0.25), (V{0, 3, 6, 7}));
  EXPECT_EQ(window_starts(8, 8, 0.0), (V{0}));
  EXPECT_EQ(window_starts(5, 2, 0.9), (V{0, 1, 2, 3}));  // step >= 1
}

// Note [The Gaussian window weights]: MONAI's compute_importance_map,
// unscaled (the peak of an even axis is below 1), floored at 1e-3.
TEST(SlidingWindow, GaussianImportanceMap) {
  SlidingWindowOptions opt;
  opt.roi = {8, 6, 5};
  const torch::Tensor map = importance_map(opt);
  EXPECT_EQ(map.sizes(), torch::IntArrayRef({8, 6, 5}));
  EXPECT_EQ(map.scalar_type(), torch::kFloat32);
  // sigma = 0.125 * roi: 1, 0.75, 0.625; the centre voxels are 0.5, 0.5
  // and 0 from the window's centre.
  const double peak =
      std::exp(-0.25 / 2) * std::exp(-0.25 / (2 * 0.75 * 0.75)) * 1.0;
  EXPECT_NEAR(map.max().item<double>(), peak, 1e-6);
  EXPECT_NEAR(map[3][2][2].item<double>(), peak, 1e-6);
  // Off centre, by axis: x = -2.5 on D (the second voxel) and 1 on W.
  EXPECT_NEAR(
      map[1][2][3].item<double>(),
      std::exp(-2.5 * 2.5 / 2) * std::exp(-0.25 / (2 * 0.75 * 0.75)) *
          std::exp(-1.0 / (2 * 0.625 * 0.625)),
      1e-7);
  // The corners fall below the floor.
  EXPECT_EQ(map.min().item<float>(), 1e-3f);
  EXPECT_EQ(map[0][0][0].item<float>(), 1e-3f);
  EXPECT_TRUE(torch::equal(map, map.flip({0, 1, 2})));  // centred
  opt.sigma_scale = 0.25;                               // wider: no floor
  EXPECT_GT(importance_map(opt).min().item<float>(), 1e-3f);
  opt.blend = Blend::kConstant;
  EXPECT_TRUE(torch::equal(importance_map(opt), torch::ones({8, 6, 5})));
}

// (a) One window covering the volume is the whole-volume forward.
TEST(SlidingWindow, SingleWindowEqualsWholeVolumeForward) {
  auto net = small_unet(1, 3);
  const PatchPredictor predict =
      [&](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
        return net->forward(x);
      };
  torch::manual_seed(5);
  const torch::Tensor volume = torch::randn({1, 8, 12, 4});
  SlidingWindowOptions opt;
  opt.roi = {8, 12, 4};
  opt.overlap = 0.0;
  const torch::Tensor probs =
      sliding_window_probs(volume, 3, predict, opt, test::cpu_placement());
  EXPECT_EQ(probs.sizes(), torch::IntArrayRef({3, 8, 12, 4}));
  EXPECT_LE(max_abs_diff(probs, whole_volume_probs(predict, volume)), 1e-6);
}

// (b) A pointwise predictor: overlapping windows agree, so any blending
// must reproduce the whole-volume softmax.
TEST(SlidingWindow, OverlappingWindowsOfPointwisePredictorBlendExactly) {
  torch::manual_seed(6);
  torch::nn::Conv3d conv(torch::nn::Conv3dOptions(2, 3, 1));
  const PatchPredictor predict = [&](const at::Tensor& x,
                                     const at::Tensor&,
                                     const at::Tensor&) { return conv(x); };
  const torch::Tensor volume = torch::randn({2, 12, 10, 9});
  const torch::Tensor expected = whole_volume_probs(predict, volume);
  for (const Blend blend : {Blend::kGaussian, Blend::kConstant}) {
    SlidingWindowOptions opt;
    opt.roi = {4, 4, 4};
    opt.overlap = 0.5;
    opt.sw_batch = 3;  // does not divide the 5 x 4 x 4 windows
    opt.blend = blend;
    const torch::Tensor probs =
        sliding_window_probs(volume, 3, predict, opt, test::cpu_placement());
    EXPECT_EQ(probs.sizes(), torch::IntArrayRef({3, 12, 10, 9}));
    EXPECT_LE(max_abs_diff(probs, expected), 1e-5) << blend;
  }
}

// (c) An axis shorter than the roi is zero-padded and cropped back.
TEST(SlidingWindow, AxisShorterThanRoiIsPaddedAndCropped) {
  torch::manual_seed(8);
  torch::nn::Conv3d conv(torch::nn::Conv3dOptions(1, 2, 1));
  const PatchPredictor predict = [&](const at::Tensor& x,
                                     const at::Tensor&,
                                     const at::Tensor&) { return conv(x); };
  const PatchPredictor predict_patch =
      [&](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
        EXPECT_EQ(x.size(3), 4);  // every patch is a full roi
        return conv(x);
      };
  const torch::Tensor volume = torch::randn({1, 8, 3, 8});
  SlidingWindowOptions opt;
  opt.roi = {4, 4, 4};
  const torch::Tensor probs = sliding_window_probs(
      volume, 2, predict_patch, opt, test::cpu_placement());
  EXPECT_EQ(probs.sizes(), torch::IntArrayRef({2, 8, 3, 8}));
  EXPECT_TRUE(probs.is_contiguous());
  EXPECT_LE(max_abs_diff(probs, whole_volume_probs(predict, volume)), 1e-5);
}

// (d) validation.padding: symmetric puts the extra voxel after (MONAI),
// end puts all padding after. A 3x3x3 convolution sees the zeros, so the
// probabilities show where the case sat in the window.
TEST(SlidingWindow, SmallCaseSitsWherePaddingPutsIt) {
  torch::manual_seed(9);
  torch::nn::Conv3d conv(torch::nn::Conv3dOptions(1, 2, 3).padding(1));
  const PatchPredictor predict = [&](const at::Tensor& x,
                                     const at::Tensor&,
                                     const at::Tensor&) { return conv(x); };
  const torch::Tensor volume = torch::randn({1, 4, 1, 5});  // H 1 of roi 4
  for (const Padding padding : {Padding::kSymmetric, Padding::kEnd}) {
    SlidingWindowOptions opt;
    opt.roi = {4, 4, 4};  // W: 5 >= 4, two windows
    opt.overlap = 0.0;
    opt.padding = padding;
    const int64_t before = padding == Padding::kSymmetric ? 1 : 0;
    EXPECT_EQ(
        pad_before({4, 1, 5}, opt.roi, padding),
        (std::array<int64_t, 3>{0, before, 0}));
    const torch::Tensor probs =
        sliding_window_probs(volume, 2, predict, opt, test::cpu_placement());
    EXPECT_EQ(probs.sizes(), torch::IntArrayRef({2, 4, 1, 5}));
    // The window at W 0..3, predicted on the padded case by hand.
    const torch::Tensor padded = torch::constant_pad_nd(
        volume.narrow(3, 0, 4), {0, 0, before, 3 - before, 0, 0});
    const torch::Tensor expected =
        torch::softmax(conv(padded.unsqueeze(0)), 1)[0].narrow(2, before, 1);
    EXPECT_LE(
        max_abs_diff(probs.narrow(3, 0, 1), expected.narrow(3, 0, 1)), 1e-6)
        << padding;
  }
}

TEST(SlidingWindow, BadInputsThrow) {
  const PatchPredictor predict =
      [](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
        return torch::zeros({x.size(0), 2, x.size(2), x.size(3), x.size(4)});
      };
  const torch::Tensor volume = torch::zeros({1, 4, 4, 4});
  SlidingWindowOptions opt;
  opt.roi = {4, 4, 4};
  opt.overlap = 1.0;
  EXPECT_THROW(
      sliding_window_probs(volume, 2, predict, opt, test::cpu_placement()),
      Error);
  opt.overlap = 0.5;
  // An unknown blend never reaches the sliding window: the config refuses
  // it.
  EXPECT_THROW(TrainConfig::load("", {"validation.blend=linear"}), Error);
  opt.blend = Blend::kConstant;
  EXPECT_THROW(
      sliding_window_probs(volume, 3, predict, opt, test::cpu_placement()),
      Error);
  EXPECT_THROW(
      sliding_window_probs(volume[0], 2, predict, opt, test::cpu_placement()),
      Error);
  EXPECT_EQ(
      sliding_window_probs(volume, 2, predict, opt, test::cpu_placement())
          .sizes(),
      torch::IntArrayRef({2, 4, 4, 4}));
}

struct Peaks {
  int64_t device = 0;  // device peak above the device bytes before the call
  int64_t host = 0;    // host peak above the host bytes before the call
  torch::Tensor probs;
};

Peaks measure(
    int64_t size,
    bool offload,
    const PatchPredictor& predict,
    int64_t classes) {
  torch::manual_seed(9);
  const torch::Tensor volume = torch::randn({1, size, size, size});
  SlidingWindowOptions opt;
  opt.roi = {8, 8, 8};
  opt.overlap = 0.25;
  opt.sw_batch = 2;
  opt.offload_cpu = offload;
  memory::release_cache();
  memory::reset_peak();
  const memory::Stats before = memory::stats();
  Peaks p;
  p.probs = sliding_window_probs(
      volume, classes, predict, opt, test::cpu_placement());
  const memory::Stats after = memory::stats();
  p.device = after.peak_allocated - before.allocated;
  p.host = after.host_peak - before.host_allocated;
  return p;
}

// (d) and (e): the device peak of offloaded aggregation does not depend on
// the volume; without offload it grows by the aggregation buffers.
TEST(SlidingWindow, OffloadKeepsDevicePeakIndependentOfVolumeSize) {
  constexpr int64_t kClasses = 2;
  std::shared_ptr<Classifier> net;
  {
    memory::DeviceScope device;  // the model's parameters are device memory
    net = small_unet(1, kClasses);
  }
  const PatchPredictor predict =
      [&](const at::Tensor& x, const at::Tensor&, const at::Tensor&) {
        return net->forward(x);
      };
  const Peaks small = measure(16, true, predict, kClasses);
  const Peaks large = measure(32, true, predict, kClasses);  // 8x the voxels
  const Peaks small_dev = measure(16, false, predict, kClasses);
  const Peaks large_dev = measure(32, false, predict, kClasses);
  std::cout << "[          ] device peak offload 16^3 " << small.device
            << " B, 32^3 " << large.device << " B; no offload 16^3 "
            << small_dev.device << " B, 32^3 " << large_dev.device << " B\n"
            << "[          ] host peak offload 16^3 " << small.host
            << " B, 32^3 " << large.host << " B; no offload 16^3 "
            << small_dev.host << " B, 32^3 " << large_dev.host << " B\n";

  ASSERT_GT(small.device, 0);  // the batches did run in the device domain
  EXPECT_EQ(large.device, small.device);
  // Host: (K + 1) x 4 bytes a voxel of sum and weight map, 8x the voxels.
  const int64_t buffers_growth =
      (kClasses + 1) * 4 * (32 * 32 * 32 - 16 * 16 * 16);
  EXPECT_GE(large.host - small.host, buffers_growth);
  // Without offload the buffers are device memory and the peak grows.
  EXPECT_GE(large_dev.device - small_dev.device, buffers_growth);
  EXPECT_LE(large_dev.device - small_dev.device, buffers_growth + 64 * 1024);
  // (e) Where the buffers live does not change the result.
  EXPECT_TRUE(torch::equal(small.probs, small_dev.probs));
  EXPECT_TRUE(torch::equal(large.probs, large_dev.probs));
  EXPECT_EQ(large.probs.sizes(), torch::IntArrayRef({2, 32, 32, 32}));
}

}  // namespace
}  // namespace memtrain
