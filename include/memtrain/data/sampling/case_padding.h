#pragma once
// Where a case smaller than a window sits in it (validation.padding): one
// rule for the sliding window of validation, `eval` and `predict`, and for
// the training patches (PatchSampler), so that a model sees small cases
// placed the same way in training and inference. No LibTorch here.

#include <algorithm>
#include <array>
#include <cstdint>

#include "memtrain/config/choices.h"

namespace memtrain {

// The padding before a case of `size` voxels in a window of `window` on
// each axis; 0 where size >= window. Symmetric: half the extra voxels
// (rounded down) before, the rest after, as MONAI's
// sliding_window_inference and SpatialPad(method="symmetric") place it;
// end: none before, all after.
inline std::array<int64_t, 3> pad_before(
    const std::array<int64_t, 3>& size,
    const std::array<int64_t, 3>& window,
    Padding padding) {
  std::array<int64_t, 3> before{};
  for (size_t a = 0; a < 3; ++a) {
    const int64_t extra = std::max<int64_t>(window[a] - size[a], 0);
    before[a] = padding == Padding::kSymmetric ? extra / 2 : 0;
  }
  return before;
}

}  // namespace memtrain
