#pragma once
// Segmentation metrics of one case: Dice and the 95th-percentile Hausdorff
// distance, as MONAI's DiceMetric and compute_hausdorff_distance(
// percentile=95) compute them. No LibTorch here.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"

namespace memtrain {

// Note [One Dice]: hard Dice of one class in one case from its voxel (or
// row) counts, MONAI DiceMetric's rule: 2|P n T| / (|P| + |T|) when the
// class is in the case's labels; when it is not, NaN with ignore_empty
// (MONAI's default: left out of every mean), else 1 if the prediction
// lacks it too and 0 if not. Whole-volume validation, the validation of
// rows that belong to volumes and `memtrain predict --labels` all score
// with this one function; validation reduces with DiceTable.
struct DiceCounts {
  int64_t both = 0;   // |P n T|
  int64_t pred = 0;   // |P|
  int64_t truth = 0;  // |T|
};
double hard_dice(const DiceCounts& c, bool ignore_empty);

// K classes' counts as K (both, pred, truth) triples of doubles: the form
// validation all-reduces them in (float64 holds counts below 2^53 exactly).
std::vector<DiceCounts> dice_counts_of(const double* triples, int64_t k);

// validation.include_background and validation.ignore_empty.
struct DiceRule {
  bool include_background = false;
  bool ignore_empty = true;
};

// Every case's Dice per class and MONAI's reductions of them. Classes
// 0..K-1 are stored; the means count classes from first_class() on (1
// unless include_background) and skip NaN.
class DiceTable {
 public:
  DiceTable(int64_t num_classes, DiceRule rule);
  // One case: `counts` of classes 0..K-1; `name` identifies it in records.
  void add(std::string name, const std::vector<DiceCounts>& counts);

  int64_t num_classes() const {
    return k_;
  }
  int64_t first_class() const {
    return rule_.include_background ? 0 : 1;
  }
  bool ignore_empty() const {
    return rule_.ignore_empty;
  }
  size_t num_cases() const {
    return names_.size();
  }
  const std::string& name(size_t i) const {
    return names_[i];
  }
  const DiceCounts& counts(size_t i, int64_t c) const {
    return counts_[i * k_ + c];
  }
  double dice(size_t i, int64_t c) const {
    return dice_[i * k_ + c];
  }
  // Case i's mean over its classes that count; NaN when none does.
  double case_mean(size_t i) const;
  // Class c's mean over the cases where it counts, NaN when none
  // (DiceMetric's reduction "mean_batch"; MONAI writes 0 there).
  double class_mean(int64_t c) const;
  // The mean of case_mean over the cases that have one (DiceMetric's
  // reduction "mean", its default: val_dice); NaN when none has.
  double mean() const;

 private:
  int64_t k_;
  DiceRule rule_;
  std::vector<std::string> names_;
  std::vector<DiceCounts> counts_;  // case-major, K per case
  std::vector<double> dice_;
};

struct ClassMetrics {
  int64_t cls = 0;
  double dice = 0;     // hard_dice (Note [One Dice])
  double hd95_mm = 0;  // both empty: 0; one empty: +inf
  int64_t pred_voxels = 0;
  int64_t true_voxels = 0;
};

// Per class of label maps `pred` and `truth` (classes 1..num_classes-1, and
// 0 first with rule.include_background; [D, H, W] of `dims`, voxels of
// `spacing_mm`): Dice (Note [One Dice]), and the symmetric
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
    int64_t num_classes,
    const DiceRule& rule);

// Squared Euclidean distance (mm^2) of every voxel to the nearest voxel where
// `feature` is non-zero (+inf without any): Felzenszwalb and Huttenlocher's
// separable transform, one pass per axis. Exposed for tests.
std::vector<double> squared_distance_transform(
    const std::vector<uint8_t>& feature,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing_mm);

// validation.include_background and validation.ignore_empty.
inline DiceRule dice_rule(const ValidationConfig& v) {
  return {v.include_background, v.ignore_empty};
}

}  // namespace memtrain
