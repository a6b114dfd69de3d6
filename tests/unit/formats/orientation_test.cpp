// Reorientation to RAS (src/formats/nifti/orientation.cpp) against cases
// computed by hand (and equal to nibabel 5's io_orientation, inv_ornt_aff and
// apply_orientation on the same affines).

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include "memtrain/formats/nifti/orientation.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

Affine make(std::array<double, 12> rows) {
  Affine a{};
  for (int e = 0; e < 12; ++e)
    a[e] = rows[e];
  a[15] = 1;
  return a;
}

void expect_affine(const Affine& got, const Affine& want) {
  for (int e = 0; e < 16; ++e)
    EXPECT_NEAR(got[e], want[e], 1e-9) << "element " << e;
}

// A grid of (i, j, k) = (5, 6, 7) voxels whose value is its index
// i + 5 j + 30 k, in memtrain order [D, H, W] = [k, j, i].
constexpr std::array<int64_t, 3> kShape = {5, 6, 7};
std::vector<float> ramp() {
  std::vector<float> v(5 * 6 * 7);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}
float at(
    const std::vector<float>& v,
    const std::array<int64_t, 3>& s,
    int64_t i,
    int64_t j,
    int64_t k) {
  return v[static_cast<size_t>((k * s[1] + j) * s[0] + i)];
}

TEST(Orientation, IdentityIsUnchanged) {
  const Affine a = make({2, 0, 0, -10, 0, 3, 0, 5, 0, 0, 4, 1});
  const Orientation o = io_orientation(a);
  EXPECT_TRUE(o.identity());
  EXPECT_EQ(reoriented_shape(o, kShape), kShape);
  expect_affine(reoriented_affine(o, a, kShape), a);
  EXPECT_EQ(reorient(ramp(), 1, kShape, o), ramp());
}

TEST(Orientation, FlippedXIsStoredReversed) {
  // i runs toward L (x decreases): stored reversed, the origin moves to
  // the old last voxel, 10 - 2 * 4 = 2.
  const Affine a = make({-2, 0, 0, 10, 0, 3, 0, -5, 0, 0, 4, 7});
  const Orientation o = io_orientation(a);
  EXPECT_EQ(o.axis, (std::array<int, 3>{0, 1, 2}));
  EXPECT_EQ(o.flip, (std::array<int, 3>{-1, 1, 1}));
  EXPECT_EQ(reoriented_shape(o, kShape), kShape);
  expect_affine(
      reoriented_affine(o, a, kShape),
      make({2, 0, 0, 2, 0, 3, 0, -5, 0, 0, 4, 7}));
  const std::vector<float> r = reorient(ramp(), 1, kShape, o);
  for (int64_t k = 0; k < 7; ++k)
    for (int64_t j = 0; j < 6; ++j)
      for (int64_t i = 0; i < 5; ++i)
        ASSERT_EQ(at(r, kShape, i, j, k), at(ramp(), kShape, 4 - i, j, k));
}

TEST(Orientation, PermutedLpsAxesArePermutedAndFlipped) {
  // i runs toward P (-y), j toward S (+z), k toward L (-x): the RAS grid
  // has x <- k reversed (7), y <- i reversed (5), z <- j (6).
  const Affine a = make({0, 0, -1.5, 90, -2, 0, 0, 120, 0, 2.5, 0, -60});
  const Orientation o = io_orientation(a);
  EXPECT_EQ(o.axis, (std::array<int, 3>{1, 2, 0}));
  EXPECT_EQ(o.flip, (std::array<int, 3>{-1, 1, -1}));
  const std::array<int64_t, 3> s = reoriented_shape(o, kShape);
  EXPECT_EQ(s, (std::array<int64_t, 3>{7, 5, 6}));
  EXPECT_EQ(
      reoriented_spacing(o, {2, 2.5, 1.5}),
      (std::array<double, 3>{1.5, 2, 2.5}));
  // x = 90 - 1.5 (6 - n0) = 81 + 1.5 n0; y = 120 - 2 (4 - n1) = 112 + 2 n1.
  expect_affine(
      reoriented_affine(o, a, kShape),
      make({1.5, 0, 0, 81, 0, 2, 0, 112, 0, 0, 2.5, -60}));
  const std::vector<float> r = reorient(ramp(), 1, kShape, o);
  for (int64_t n2 = 0; n2 < 6; ++n2)
    for (int64_t n1 = 0; n1 < 5; ++n1)
      for (int64_t n0 = 0; n0 < 7; ++n0)
        ASSERT_EQ(at(r, s, n0, n1, n2), at(ramp(), kShape, 4 - n1, n2, 6 - n0));
  EXPECT_EQ(reorient_back(r, 1, kShape, o), ramp());
}

TEST(Orientation, ObliqueGoesToTheClosestAxes) {
  // Rotated 60 degrees about z, voxels 2 x 3 x 4 mm: i runs mostly toward
  // A (cos 60 = 0.5 along x, 0.866 along y), j mostly toward L
  // (-0.866 along x), k toward S. RAS grid: x <- j reversed (6),
  // y <- i (5), z <- k (7).
  const double c = 0.5, s = std::sqrt(3.0) / 2;
  const Affine a = make({2 * c, -3 * s, 0, 1, 2 * s, 3 * c, 0, 2, 0, 0, 4, 3});
  const Orientation o = io_orientation(a);
  EXPECT_EQ(o.axis, (std::array<int, 3>{1, 0, 2}));
  EXPECT_EQ(o.flip, (std::array<int, 3>{1, -1, 1}));
  EXPECT_EQ(reoriented_shape(o, kShape), (std::array<int64_t, 3>{6, 5, 7}));
  // New x index n0 is old j = 5 - n0: column -A[:, 1], origin A[:, 1] * 5.
  expect_affine(
      reoriented_affine(o, a, kShape),
      make(
          {3 * s,
           2 * c,
           0,
           1 - 15 * s,
           -3 * c,
           2 * s,
           0,
           2 + 15 * c,
           0,
           0,
           4,
           3}));
  const std::vector<float> r = reorient(ramp(), 1, kShape, o);
  for (int64_t n2 = 0; n2 < 7; ++n2)
    for (int64_t n1 = 0; n1 < 5; ++n1)
      for (int64_t n0 = 0; n0 < 6; ++n0)
        ASSERT_EQ(
            at(r, {6, 5, 7}, n0, n1, n2), at(ramp(), kShape, n1, 5 - n0, n2));
}

TEST(Orientation, ChannelsMoveTogetherAndComeBack) {
  const Affine a = make({0, 0, -1.5, 90, -2, 0, 0, 120, 0, 2.5, 0, -60});
  const Orientation o = io_orientation(a);
  std::vector<uint8_t> two(2 * 5 * 6 * 7);
  for (size_t e = 0; e < two.size(); ++e)
    two[e] = static_cast<uint8_t>(e % 251);
  const std::vector<uint8_t> r = reorient(two, 2, kShape, o);
  const std::vector<uint8_t> r0 = reorient(
      std::vector<uint8_t>(two.begin(), two.begin() + 210), 1, kShape, o);
  const std::vector<uint8_t> r1 = reorient(
      std::vector<uint8_t>(two.begin() + 210, two.end()), 1, kShape, o);
  EXPECT_TRUE(std::equal(r0.begin(), r0.end(), r.begin()));
  EXPECT_TRUE(std::equal(r1.begin(), r1.end(), r.begin() + 210));
  EXPECT_EQ(reorient_back(r, 2, kShape, o), two);
}

TEST(Orientation, SingularTransformIsRefused) {
  const Affine a = make({1, 1, 0, 0, 1, 1, 0, 0, 0, 0, 1, 0});
  EXPECT_THROW(io_orientation(a), Error);
}

TEST(Orientation, ResampledAffineCentresTheGrids) {
  // 10 voxels of 1 mm -> 5 of 2 mm: new voxel o is old 4.5 + (o - 2) * 2 =
  // 0.5 + 2 o; 4 voxels of 3 mm -> 6 of 2 mm: old 1.5 + (o - 2.5) * 2/3.
  const Affine a = make({1, 0, 0, 10, 0, 3, 0, 20, 0, 0, 2, 30});
  const Affine r =
      resampled_affine(a, {10, 4, 8}, {1, 3, 2}, {5, 6, 8}, {2, 2, 2});
  expect_affine(
      r,
      make(
          {2,
           0,
           0,
           10.5,
           0,
           2,
           0,
           20 + 3 * (1.5 - 2.5 * 2.0 / 3),
           0,
           0,
           2,
           30}));
}

}  // namespace
}  // namespace memtrain
