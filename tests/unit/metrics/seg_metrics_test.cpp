// Dice, HD95 and the distance transform behind them (memtrain predict's
// metrics.csv), and the trilinear resampling predict uses both ways.

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <random>

#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/metrics/dice_report.h"
#include "memtrain/metrics/seg_metrics.h"

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
  const auto m = segmentation_metrics(a, b, n, {1.0, 1.0, 1.5}, 2, DiceRule{});
  ASSERT_EQ(m.size(), 1u);
  EXPECT_DOUBLE_EQ(m[0].dice, 0.5);
  EXPECT_DOUBLE_EQ(m[0].hd95_mm, 3.0);
  EXPECT_EQ(m[0].pred_voxels, 64);
  EXPECT_EQ(m[0].true_voxels, 64);
  // The same masks: Dice 1, HD95 0; not labelled: no Dice (NaN, Note [One
  // Dice]), HD95 inf when predicted, 0 when in neither.
  EXPECT_DOUBLE_EQ(
      segmentation_metrics(a, a, n, {1, 1, 1}, 2, DiceRule{})[0].dice, 1.0);
  EXPECT_DOUBLE_EQ(
      segmentation_metrics(a, a, n, {1, 1, 1}, 2, DiceRule{})[0].hd95_mm, 0);
  const std::vector<uint8_t> none(a.size(), 0);
  const auto e = segmentation_metrics(a, none, n, {1, 1, 1}, 3, DiceRule{});
  ASSERT_EQ(e.size(), 2u);
  EXPECT_TRUE(std::isnan(e[0].dice));  // predicted, not labelled
  EXPECT_TRUE(std::isinf(e[0].hd95_mm));
  EXPECT_TRUE(std::isnan(e[1].dice));  // class 2: in neither
  EXPECT_DOUBLE_EQ(e[1].hd95_mm, 0.0);
  // ignore_empty off: 0 and 1; include_background: class 0 first.
  const auto f = segmentation_metrics(a, none, n, {1, 1, 1}, 3, {true, false});
  ASSERT_EQ(f.size(), 3u);
  EXPECT_EQ(f[0].cls, 0);
  EXPECT_DOUBLE_EQ(f[0].dice, 2.0 * (a.size() - 64) / (2.0 * a.size() - 64));
  EXPECT_DOUBLE_EQ(f[1].dice, 0.0);
  EXPECT_DOUBLE_EQ(f[2].dice, 1.0);
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

// Note [One Dice]: MONAI DiceMetric's rule, and its reductions.
TEST(HardDice, CountsAndTheEmptyClassRule) {
  for (const bool ignore : {true, false}) {
    EXPECT_DOUBLE_EQ(hard_dice({3, 4, 5}, ignore), 6.0 / 9.0);
    EXPECT_DOUBLE_EQ(hard_dice({7, 7, 7}, ignore), 1.0);
    EXPECT_DOUBLE_EQ(hard_dice({0, 0, 2}, ignore), 0.0);  // not predicted
  }
  // Not labelled: left out with ignore_empty, whatever the prediction;
  // else 0 when predicted and 1 when not (MONAI's DiceHelper).
  EXPECT_TRUE(std::isnan(hard_dice({0, 3, 0}, true)));
  EXPECT_TRUE(std::isnan(hard_dice({0, 0, 0}, true)));
  EXPECT_DOUBLE_EQ(hard_dice({0, 3, 0}, false), 0.0);
  EXPECT_DOUBLE_EQ(hard_dice({0, 0, 0}, false), 1.0);
}

TEST(DiceTable, MonaiReductionsAndTheSummary) {
  // Three classes, three cases. Case a: class 1 Dice 0.5, class 2 absent
  // from the labels but predicted; case b: class 1 1.0, class 2 0.25;
  // case c: no foreground labelled at all.
  DiceTable t(3, DiceRule{});
  t.add("a", {{90, 95, 95}, {2, 4, 4}, {0, 1, 0}});
  t.add("b", {{50, 50, 50}, {3, 3, 3}, {1, 4, 4}});
  t.add("c", {{99, 99, 100}, {0, 1, 0}, {0, 0, 0}});
  EXPECT_DOUBLE_EQ(t.dice(0, 1), 0.5);
  EXPECT_TRUE(std::isnan(t.dice(0, 2)));
  EXPECT_DOUBLE_EQ(t.case_mean(0), 0.5);
  EXPECT_DOUBLE_EQ(t.case_mean(1), (1.0 + 0.25) / 2);
  EXPECT_TRUE(std::isnan(t.case_mean(2)));
  // "mean": over the cases that have a mean; "mean_batch": per class.
  EXPECT_DOUBLE_EQ(t.mean(), (0.5 + 0.625) / 2);
  EXPECT_DOUBLE_EQ(t.class_mean(1), 0.75);
  EXPECT_DOUBLE_EQ(t.class_mean(2), 0.25);
  // The background counts with include_background.
  DiceTable bg(3, {true, true});
  bg.add("a", {{90, 95, 95}, {2, 4, 4}, {0, 1, 0}});
  EXPECT_DOUBLE_EQ(bg.case_mean(0), (180.0 / 190.0 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(bg.mean(), bg.case_mean(0));

  const nlohmann::json cases = dice_cases(t);
  ASSERT_EQ(cases.size(), 3u);
  EXPECT_EQ(cases[0]["case"], "a");
  EXPECT_DOUBLE_EQ(cases[0]["dice"]["1"].get<double>(), 0.5);
  EXPECT_TRUE(cases[0]["dice"]["2"].is_null());
  EXPECT_FALSE(cases[0]["dice"].contains("0"));
  EXPECT_TRUE(cases[2]["mean"].is_null());
  const nlohmann::json s = dice_summary(t);
  EXPECT_EQ(s["metric_per_case"][1]["case"], "b");
  const nlohmann::json& b2 = s["metric_per_case"][1]["metrics"]["2"];
  EXPECT_EQ(b2["TP"], 1);
  EXPECT_EQ(b2["FP"], 3);
  EXPECT_EQ(b2["FN"], 3);
  EXPECT_EQ(b2["n_ref"], 4);
  EXPECT_DOUBLE_EQ(s["mean"]["1"]["Dice"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(s["foreground_mean"]["Dice"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(s["case_mean"]["Dice"].get<double>(), t.mean());
  EXPECT_EQ(s["rule"]["ignore_empty"], true);
  const nlohmann::json per_class = dice_per_class(t);
  ASSERT_EQ(per_class.size(), 3u);
  EXPECT_DOUBLE_EQ(per_class[2].get<double>(), 0.25);
}

}  // namespace
}  // namespace memtrain
