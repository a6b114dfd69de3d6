// Dice, HD95 and the distance transform behind them (memtrain predict's
// metrics.csv), and the trilinear resampling predict uses both ways.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "memtrain/data/nifti_volume.h"
#include "memtrain/train/eval/seg_metrics.h"

namespace memtrain {
namespace {

TEST(SegMetrics, DistanceTransformIsExactWithAnisotropicSpacing) {
  const std::array<int64_t, 3> n = {5, 7, 6};
  const std::array<double, 3> s = {2.0, 0.5, 1.25};
  std::mt19937 rng(3);
  std::vector<uint8_t> f(5 * 7 * 6, 0);
  for (auto& v : f)
    v = rng() % 9 == 0;
  const std::vector<double> d2 = squared_distance_transform(f, n, s);
  for (int64_t z = 0; z < n[0]; ++z)
    for (int64_t y = 0; y < n[1]; ++y)
      for (int64_t x = 0; x < n[2]; ++x) {
        double best = std::numeric_limits<double>::infinity();
        for (int64_t i = 0; i < static_cast<int64_t>(f.size()); ++i) {
          if (!f[i])
            continue;
          const double dz = (z - i / (n[1] * n[2])) * s[0];
          const double dy = (y - (i / n[2]) % n[1]) * s[1];
          const double dx = (x - i % n[2]) * s[2];
          best = std::min(best, dz * dz + dy * dy + dx * dx);
        }
        EXPECT_NEAR(d2[(z * n[1] + y) * n[2] + x], best, 1e-9);
      }
}

TEST(SegMetrics, DiceAndHd95OfShiftedCubes) {
  // Two 4^3 cubes in a 12^3 grid, one shifted by 2 voxels along W
  // (spacing 1.5 mm there): Dice 2*32/128 = 0.5; every surface voxel of
  // one is 0 or 3 mm from the other's surface, and more than 5% are 3 mm.
  const std::array<int64_t, 3> n = {12, 12, 12};
  std::vector<uint8_t> a(12 * 12 * 12, 0), b(12 * 12 * 12, 0);
  for (int z = 4; z < 8; ++z)
    for (int y = 4; y < 8; ++y)
      for (int x = 4; x < 8; ++x) {
        a[(z * 12 + y) * 12 + x] = 1;
        b[(z * 12 + y) * 12 + x + 2] = 1;
      }
  const auto m = segmentation_metrics(a, b, n, {1.0, 1.0, 1.5}, 2);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_DOUBLE_EQ(m[0].dice, 0.5);
  EXPECT_DOUBLE_EQ(m[0].hd95_mm, 3.0);
  EXPECT_EQ(m[0].pred_voxels, 64);
  EXPECT_EQ(m[0].true_voxels, 64);
  // The same masks: Dice 1, HD95 0; one empty: Dice 0, HD95 inf; both
  // empty: no Dice (NaN, Note [Dice of an empty class]), HD95 0.
  EXPECT_DOUBLE_EQ(segmentation_metrics(a, a, n, {1, 1, 1}, 2)[0].dice, 1.0);
  EXPECT_DOUBLE_EQ(segmentation_metrics(a, a, n, {1, 1, 1}, 2)[0].hd95_mm, 0);
  const std::vector<uint8_t> none(a.size(), 0);
  const auto e = segmentation_metrics(a, none, n, {1, 1, 1}, 3);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_DOUBLE_EQ(e[0].dice, 0.0);
  EXPECT_TRUE(std::isinf(e[0].hd95_mm));
  EXPECT_TRUE(std::isnan(e[1].dice));  // class 2: in neither
  EXPECT_DOUBLE_EQ(e[1].hd95_mm, 0.0);
}

TEST(NiftiVolume, ResamplingKeepsALinearRampAndRoundTripsItsShape) {
  // A ramp along W at 1 mm, resampled to 2 mm and back: values on the
  // centred grids follow the ramp (clamped at the borders).
  const std::array<int64_t, 3> n = {2, 3, 9};
  std::vector<float> v(2 * 3 * 9);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<float>(i % 9);
  const auto m = resampled_dims(n, {1, 1, 1}, {1, 1, 2});
  EXPECT_EQ(m, (std::array<int64_t, 3>{2, 3, 5}));  // round(9 / 2) = 5 (4.5)
  const auto half = resample_linear(v, 1, n, {1, 1, 1}, m, {1, 1, 2});
  // Output voxel o at input x = 4 + (o - 2) * 2: 0, 2, 4, 6, 8.
  for (int o = 0; o < 5; ++o)
    EXPECT_FLOAT_EQ(half[o], 2.0f * o);
  const auto back = resample_linear(half, 1, m, {1, 1, 2}, n, {1, 1, 1});
  for (int x = 0; x < 9; ++x)
    EXPECT_NEAR(back[x], static_cast<float>(x), 1e-5);
  // Equal spacing and size: the identity.
  EXPECT_EQ(
      resample_linear(v, 2, {1, 3, 9}, {1, 1, 1}, {1, 3, 9}, {1, 1, 1}), v);
}

TEST(NiftiVolume, ZScoreOverNonZeroVoxels) {
  const IntensityNorm z = nonzero_zscore({0, 0, 1, 3});  // mean 2, std 1
  EXPECT_DOUBLE_EQ(z.scale, 1.0);
  EXPECT_DOUBLE_EQ(z.shift, -2.0);
  const IntensityNorm none = nonzero_zscore({0, 0});
  EXPECT_DOUBLE_EQ(none.scale, 1.0);
  EXPECT_DOUBLE_EQ(none.shift, 0.0);
}

}  // namespace
}  // namespace memtrain

namespace memtrain {
namespace {

// Note [Dice of an empty class]: the one hard Dice of validation and predict.
TEST(HardDice, CountsAndTheEmptyClassRule) {
  EXPECT_DOUBLE_EQ(hard_dice(3, 4, 5), 6.0 / 9.0);
  EXPECT_DOUBLE_EQ(hard_dice(7, 7, 7), 1.0);
  EXPECT_DOUBLE_EQ(hard_dice(0, 3, 0), 0.0);    // predicted, not labelled
  EXPECT_DOUBLE_EQ(hard_dice(0, 0, 2), 0.0);    // labelled, not predicted
  EXPECT_TRUE(std::isnan(hard_dice(0, 0, 0)));  // in neither: no Dice
}

}  // namespace
}  // namespace memtrain
