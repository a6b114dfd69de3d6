#pragma once
// Validation overlays (Note [Validation overlays] in ARCHITECTURE.md): one
// slice of a validation volume as three panels side by side,
//   image | image with the label | image with the prediction,
// the image in grey (min-max of the slice → 0..255), class c > 0 blended
// half and half with class_colour(c), class 0 left grey. No LibTorch.

#include <array>
#include <cstdint>
#include <string>

#include "memtrain/util/png.h"

namespace memtrain {

std::array<uint8_t, 3> class_colour(int64_t c);

// Each panel is the (h, w) slice scaled up `scale` times (nearest).
RgbImage compose_overlay(
    const float* image,
    const int64_t* label,
    const int64_t* pred,
    int64_t h,
    int64_t w,
    int64_t scale);

// The scale that makes the slice's longer side at least 256 pixels (1 for
// slices that are already that large).
int64_t overlay_scale(int64_t h, int64_t w);

// `dir`/case-<volume, 3 digits>.png, atomically; creates `dir`.
void write_overlay(
    const std::string& dir,
    int64_t volume,
    const float* image,
    const int64_t* label,
    const int64_t* pred,
    int64_t h,
    int64_t w);

}  // namespace memtrain
