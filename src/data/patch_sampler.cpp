#include "memtrain/data/patch_sampler.h"

#include <algorithm>

#include "memtrain/data/counter_rng.h"
#include "memtrain/data/h5_dataset.h"
#include "memtrain/util/error.h"

namespace memtrain {

PatchSampler::PatchSampler(
    const H5Dataset& data,
    const std::array<int64_t, 3>& patch,
    int64_t patches_per_volume,
    double pos_fraction,
    uint64_t seed,
    const std::string& flip)
    : data_(data),
      patch_(patch),
      num_volumes_(data.info().num_samples),
      per_volume_(patches_per_volume),
      pos_fraction_(pos_fraction),
      seed_(seed) {
  const DatasetInfo& info = data.info();
  MT_INTERNAL_ASSERT(info.kind == SampleKind::kVolumes, "not a volume file");
  for (int i = 0; i < 3; ++i)
    shape_[i] = info.sample_shape[i + 1];
  MT_CHECK(
      patch[0] <= shape_[0] && patch[1] <= shape_[1] && patch[2] <= shape_[2],
      "data.patch_size=[",
      patch[0],
      ", ",
      patch[1],
      ", ",
      patch[2],
      "] is larger than the volumes of '",
      info.path,
      "' ([",
      shape_[0],
      ", ",
      shape_[1],
      ", ",
      shape_[2],
      "] voxels); use a patch no larger than the volume on every axis");
  MT_CHECK(patches_per_volume > 0, "data.patches_per_volume must be > 0");
  MT_CHECK(
      flip == "none" || flip == "w" || flip == "all",
      "data.flip='",
      flip,
      "' is not none, w or all");
  may_flip_ = {flip == "all", flip == "all", flip != "none"};
}

PatchRef PatchSampler::at(int64_t epoch, int64_t sample) const {
  PatchRef r;
  r.volume = sample % num_volumes_;
  const CounterDraws d{sample_key(seed_, 0x5851f42d4c957f2dULL, epoch, sample)};
  const std::vector<int64_t>& fg = data_.foreground(r.volume);
  if (!fg.empty() && d.unit(0) < pos_fraction_) {
    const int64_t voxel = fg[d.below(1, static_cast<int64_t>(fg.size()))];
    const int64_t plane = shape_[1] * shape_[2];
    const std::array<int64_t, 3> centre = {
        voxel / plane, (voxel % plane) / shape_[2], voxel % shape_[2]};
    for (int i = 0; i < 3; ++i) {
      // The patch around the voxel, moved inside the volume; the voxel
      // stays inside the patch.
      r.corner[i] = std::clamp<int64_t>(
          centre[i] - patch_[i] / 2, 0, shape_[i] - patch_[i]);
    }
    r.foreground = true;
  } else {
    for (int i = 0; i < 3; ++i)
      r.corner[i] = d.below(2 + i, shape_[i] - patch_[i] + 1);
  }
  for (int i = 0; i < 3; ++i)
    r.flip[i] = may_flip_[i] && d.unit(5 + i) < 0.5;
  return r;
}

}  // namespace memtrain
