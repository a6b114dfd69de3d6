// model.context's crops (input/context_crop.h): the box's geometry, the
// resize against torch's F.interpolate, 0 outside the volume, and the crop
// training reads from the file equal to the one the sliding window cuts
// from the case.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/input/batch_loader.h"
#include "memtrain/input/context_crop.h"
#include "test_support.h"

namespace memtrain {
namespace {

// The box keeps the slice axis, widens the other two about the same centre.
TEST(ContextCrop, TheBoxHasThePatchsCentre) {
  const Box b = context_box({2, 3, 4}, {4, 16, 16}, ContextView{2.0, 0});
  EXPECT_EQ(b.size, (std::array<int64_t, 3>{4, 32, 32}));
  EXPECT_EQ(b.corner, (std::array<int64_t, 3>{2, -5, -4}));
  // 2 x 15 = 30 leaves a margin of 15: one more voxel, 8 on each side.
  const Box odd = context_box({0, 0, 0}, {15, 6, 16}, ContextView{2.0, 1});
  EXPECT_EQ(odd.size, (std::array<int64_t, 3>{31, 6, 32}));
  EXPECT_EQ(odd.corner, (std::array<int64_t, 3>{-8, 0, -8}));
  // 1.5 x 6 = 9: margin 3, made 4.
  const Box b15 = context_box({5, 5, 5}, {6, 6, 6}, ContextView{1.5, 2});
  EXPECT_EQ(b15.size, (std::array<int64_t, 3>{10, 10, 6}));
  EXPECT_EQ(b15.corner, (std::array<int64_t, 3>{3, 3, 5}));
}

// The resize is torch.nn.functional.interpolate(mode="bilinear",
// align_corners=False, antialias=True); the expected values are torch
// 2.11's for arange(36) as 6x6 shrunk to 4x4. Slices across W here.
TEST(ContextCrop, ResizeIsTorchsAntialiasedBilinear) {
  const at::Tensor crop =
      torch::arange(36, torch::kFloat).reshape({1, 6, 6, 1});
  const at::Tensor out = resize_context(crop, {4, 4, 1}, ContextView{1.5, 2});
  ASSERT_EQ(out.sizes(), torch::IntArrayRef({1, 4, 4, 1}));
  const std::vector<float> torch_211 = {
      2.625000238f,
      4.027778149f,
      5.472222328f,
      6.875000477f,
      11.04166698f,
      12.44444561f,
      13.88888931f,
      15.29166698f,
      19.70833206f,
      21.11111259f,
      22.55555344f,
      23.95833206f,
      28.125f,
      29.52778053f,
      30.97222137f,
      32.375f};
  const at::Tensor expected = torch::tensor(torch_211).reshape({1, 4, 4, 1});
  EXPECT_LE((out - expected).abs().max().item<double>(), 1e-5);
}

// Outside the volume the crop is 0, as the sliding window pads.
TEST(ContextCrop, OutsideTheVolumeIsZero) {
  const at::Tensor volume = torch::ones({1, 4, 8, 8});
  const at::Tensor c =
      cut_context(volume, {0, 0, 0}, {4, 4, 4}, ContextView{2.0, 0});
  ASSERT_EQ(c.sizes(), torch::IntArrayRef({1, 4, 4, 4}));
  // The box is rows and columns -2..5: its first quarter is outside.
  EXPECT_LT(c[0][0][0][0].item<float>(), 0.5f);
  EXPECT_NEAR(c[0][0][3][3].item<float>(), 1.0f, 1e-6);
  // Wholly inside: the crop of a constant volume is that constant.
  const at::Tensor inner =
      cut_context(volume * 3, {0, 2, 2}, {4, 4, 4}, ContextView{2.0, 0});
  EXPECT_LE((inner - 3).abs().max().item<double>(), 1e-6);
}

// Training's crops (read from the file by hyperslab, flipped with their
// patch) are the sliding window's (cut from the whole case), voxel for
// voxel, across each slice axis, with flips and crops leaving the case.
TEST(ContextCrop, TrainingReadsWhatValidationCuts) {
  test::TempDir dir("ctx");
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 2;
  spec.channels = 2;
  spec.depth = 12;
  spec.height = 10;
  spec.width = 14;
  spec.classes = 3;
  spec.chunk = 4;
  const std::string path = dir.file("v.h5");
  make_synthetic(spec, path);
  const H5Dataset ds = H5Dataset::open(path, "t");
  std::vector<at::Tensor> whole;
  for (int64_t v = 0; v < 2; ++v) {
    at::Tensor x = torch::empty({2, 12, 10, 14});
    at::Tensor y = torch::empty({12, 10, 14}, torch::kInt64);
    ds.read_volume(v, x.data_ptr<float>(), y.data_ptr<int64_t>());
    whole.push_back(x);
  }
  for (int64_t axis = 0; axis < 3; ++axis) {
    const std::array<int64_t, 3> patch{4, 6, 8};
    const PatchSampler sampler(ds, patch, 4, 0.5, 11, Flip::kAll);
    const ContextView view{2.0, axis};
    const PatchSource source(ds, sampler, nullptr, view);
    const std::vector<int64_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
    Batch b = source.allocate(static_cast<int64_t>(ids.size()), false);
    ASSERT_TRUE(b.context.defined());
    source.read(3, ids, b);
    int64_t flipped = 0;
    for (size_t k = 0; k < ids.size(); ++k) {
      const PatchRef r = sampler.at(3, ids[k]);
      at::Tensor expected = cut_context(whole[r.volume], r.corner, patch, view);
      std::vector<int64_t> dims;
      for (int64_t a = 0; a < 3; ++a) {
        if (r.flip[a])
          dims.push_back(a + 1);
      }
      flipped += dims.empty() ? 0 : 1;
      if (!dims.empty())
        expected = expected.flip(dims);
      EXPECT_LE(
          (b.context[static_cast<int64_t>(k)] - expected)
              .abs()
              .max()
              .item<double>(),
          1e-6)
          << "axis " << axis << ", sample " << k;
    }
    EXPECT_GT(flipped, 0);
  }
}

}  // namespace
}  // namespace memtrain
