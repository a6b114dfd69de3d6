#pragma once
// PatchSampler: which patch of which volume training sample `i` of an epoch
// is. Sample i is a patch of volume i mod N; its corner is drawn from
// (data.seed, epoch, i) alone, so a rank's sequence of patches depends only
// on the seed, the epoch and which samples the ShardedSampler gives the rank
// -- never on thread timing or the world size. With probability
// data.pos_fraction the patch is centred on a foreground voxel (mask > 0;
// see H5Dataset::foreground), otherwise its corner is uniform. data.flip
// mirrors patches (each allowed axis with probability 1/2), drawn the same
// way.

#include <array>
#include <cstdint>
#include <string>

#include "memtrain/config/choices.h"

namespace memtrain {

class H5Dataset;

struct PatchRef {
  int64_t volume = 0;
  std::array<int64_t, 3> corner{0, 0, 0};  // [D, H, W]
  bool foreground = false;                 // centred on a foreground voxel
  std::array<bool, 3> flip{false, false, false};  // mirror along D, H, W
};

class PatchSampler {
 public:
  // Throws memtrain::Error naming the file when the patch is larger than
  // every case on an axis; a case smaller than the patch on an axis is
  // placed in it by `padding` (pad_before, validation.padding) and padded
  // (H5Dataset::read_patch).
  PatchSampler(
      const H5Dataset& data,
      const std::array<int64_t, 3>& patch,
      int64_t patches_per_volume,
      double pos_fraction,
      uint64_t seed,
      Flip flip = Flip::kNone,
      Padding padding = Padding::kSymmetric);

  int64_t num_samples() const {
    return num_volumes_ * per_volume_;
  }
  const std::array<int64_t, 3>& patch() const {
    return patch_;
  }
  PatchRef at(int64_t epoch, int64_t sample) const;

 private:
  const H5Dataset& data_;
  std::array<int64_t, 3> patch_;
  int64_t num_volumes_;
  int64_t per_volume_;
  double pos_fraction_;
  uint64_t seed_;
  Padding padding_;
  std::array<bool, 3> may_flip_{false, false, false};
};

}  // namespace memtrain
