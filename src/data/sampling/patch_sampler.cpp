#include "memtrain/data/sampling/patch_sampler.h"

#include <algorithm>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/case_padding.h"
#include "memtrain/util/counter_rng.h"
#include "memtrain/util/error.h"

namespace memtrain {

PatchSampler::PatchSampler(
    const H5Dataset& data,
    const std::array<int64_t, 3>& patch,
    int64_t patches_per_volume,
    double pos_fraction,
    uint64_t seed,
    Flip flip,
    Padding padding)
    : data_(data),
      patch_(patch),
      num_volumes_(data.info().num_samples),
      per_volume_(patches_per_volume),
      pos_fraction_(pos_fraction),
      seed_(seed),
      padding_(padding) {
  const DatasetInfo& info = data.info();
  MT_INTERNAL_ASSERT(info.kind == SampleKind::kVolumes, "not a volume file");
  // The array's [D, H, W] is the largest case on each axis: a patch larger
  // than that fits no case at all. A smaller case is padded (at()).
  std::array<int64_t, 3> largest{};
  for (int i = 0; i < 3; ++i)
    largest[i] = info.sample_shape[i + 1];
  MT_CHECK(
      patch[0] <= largest[0] && patch[1] <= largest[1] &&
          patch[2] <= largest[2],
      "data.patch_size=[",
      patch[0],
      ", ",
      patch[1],
      ", ",
      patch[2],
      "] is larger than ",
      info.ragged ? "every case" : "the volumes",
      " of '",
      info.path,
      "' ([",
      largest[0],
      ", ",
      largest[1],
      ", ",
      largest[2],
      "] voxels",
      info.ragged ? " at most" : "",
      "); use a patch no larger than the volume on every axis");
  MT_CHECK(patches_per_volume > 0, "data.patches_per_volume must be > 0");
  may_flip_ = {flip == Flip::kAll, flip == Flip::kAll, flip != Flip::kNone};
}

PatchRef PatchSampler::at(int64_t epoch, int64_t sample) const {
  PatchRef r;
  r.volume = sample % num_volumes_;
  const CounterDraws d{sample_key(seed_, 0x5851f42d4c957f2dULL, epoch, sample)};
  const std::vector<int64_t>& fg = data_.foreground(r.volume);
  // Corners keep the patch inside the case; on an axis where the case is
  // smaller than the patch, the case lies inside the patch instead, where
  // validation's sliding window puts it (pad_before: by default MONAI's
  // symmetric padding, as SpatialPad before a crop), and read_patch pads
  // the rest. The draws below are the same either way: on such an axis
  // below(.., 1) is 0.
  const auto& e = data_.info().volume_shape(r.volume);
  const std::array<int64_t, 3> before = pad_before(e, patch_, padding_);
  std::array<int64_t, 3> lo{}, hi{};
  for (int i = 0; i < 3; ++i) {
    lo[i] = e[i] < patch_[i] ? -before[i] : 0;
    hi[i] = std::max<int64_t>(lo[i], e[i] - patch_[i]);
  }
  if (!fg.empty() && d.unit(0) < pos_fraction_) {
    const int64_t voxel = fg[d.below(1, static_cast<int64_t>(fg.size()))];
    const int64_t plane = e[1] * e[2];
    const std::array<int64_t, 3> centre = {
        voxel / plane, (voxel % plane) / e[2], voxel % e[2]};
    for (int i = 0; i < 3; ++i) {
      // The patch around the voxel, moved inside the case; the voxel
      // stays inside the patch.
      r.corner[i] =
          std::clamp<int64_t>(centre[i] - patch_[i] / 2, lo[i], hi[i]);
    }
    r.foreground = true;
  } else {
    for (int i = 0; i < 3; ++i)
      r.corner[i] = lo[i] + d.below(2 + i, hi[i] - lo[i] + 1);
  }
  for (int i = 0; i < 3; ++i)
    r.flip[i] = may_flip_[i] && d.unit(5 + i) < 0.5;
  return r;
}

}  // namespace memtrain
