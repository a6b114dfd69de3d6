#pragma once
// Segmentation metrics of one case: Dice and the 95th-percentile Hausdorff
// distance, as MONAI's DiceMetric and compute_hausdorff_distance(
// percentile=95) compute them. No LibTorch here.

#include <array>
#include <cstdint>
#include <vector>

namespace memtrain {

// Note [Dice of an empty class]: hard Dice of one class from its voxel
// counts, 2|P n T| / (|P| + |T|). A class in neither the labels nor the
// prediction has no Dice: NaN, and every mean over classes or volumes skips
// it (nnU-Net's evaluation does the same; a 1.0 would reward a model for
// classes the case does not contain). A class in one of the two scores 0.
// Validation (whole volumes and rows of volumes) and `memtrain predict`
// --labels all use this one function.
double hard_dice(int64_t both, int64_t pred, int64_t truth);

struct ClassMetrics {
  int64_t cls = 0;
  double dice = 0;     // hard_dice: NaN when the class is in neither
  double hd95_mm = 0;  // both empty: 0; one empty: +inf
  int64_t pred_voxels = 0;
  int64_t true_voxels = 0;
};

// Per foreground class 1..num_classes-1 of label maps `pred` and `truth`
// ([D, H, W] of `dims`, voxels of `spacing_mm`): Dice, and the symmetric
// 95th-percentile surface distance in mm: the surfaces are each mask's
// voxels with a 6-neighbour outside the mask (the volume's border counts
// as outside), the distances of one surface's voxels to the nearest voxel
// of the other's (exact Euclidean distance transform with the spacing),
// the 95th percentile of each direction (linear interpolation, as
// numpy.percentile), and the larger of the two.
std::vector<ClassMetrics> segmentation_metrics(
    const std::vector<uint8_t>& pred,
    const std::vector<uint8_t>& truth,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing_mm,
    int64_t num_classes);

// Squared Euclidean distance (mm^2) of every voxel to the nearest voxel where
// `feature` is non-zero (+inf without any): Felzenszwalb and Huttenlocher's
// separable transform, one pass per axis. Exposed for tests.
std::vector<double> squared_distance_transform(
    const std::vector<uint8_t>& feature,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing_mm);

}  // namespace memtrain
