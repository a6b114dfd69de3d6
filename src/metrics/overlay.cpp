#include "memtrain/metrics/overlay.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "memtrain/util/atomic_file.h"

namespace memtrain {

std::array<uint8_t, 3> class_colour(int64_t c) {
  static const std::array<uint8_t, 3> colours[] = {
      {230, 25, 75},   // red
      {60, 180, 75},   // green
      {0, 130, 200},   // blue
      {255, 225, 25},  // yellow
      {145, 30, 180},  // purple
      {70, 240, 240},  // cyan
      {245, 130, 48},  // orange
      {240, 50, 230},  // magenta
  };
  return colours[(c - 1) % 8];
}

RgbImage compose_overlay(
    const float* image,
    const int64_t* label,
    const int64_t* pred,
    int64_t h,
    int64_t w,
    int64_t scale) {
  const int64_t n = h * w;
  const auto [lo, hi] = std::minmax_element(image, image + n);
  const float range = *hi - *lo;
  RgbImage out;
  out.width = 3 * w * scale;
  out.height = h * scale;
  out.rgb.resize(static_cast<size_t>(out.width * out.height * 3));
  for (int64_t y = 0; y < out.height; ++y) {
    for (int64_t x = 0; x < out.width; ++x) {
      const int64_t panel = x / (w * scale);
      const int64_t i = (y / scale) * w + (x % (w * scale)) / scale;
      const int grey =
          range > 0 ? static_cast<int>(
                          std::lround(255.0 * (image[i] - *lo) / double(range)))
                    : 0;
      const int64_t c = panel == 0 ? 0 : panel == 1 ? label[i] : pred[i];
      uint8_t* px = &out.rgb[static_cast<size_t>((y * out.width + x) * 3)];
      for (int k = 0; k < 3; ++k) {
        px[k] = static_cast<uint8_t>(
            c > 0 ? (grey + class_colour(c)[k]) / 2 : grey);
      }
    }
  }
  return out;
}

int64_t overlay_scale(int64_t h, int64_t w) {
  const int64_t longer = std::max<int64_t>(1, std::max(h, w));
  return std::max<int64_t>(1, (256 + longer - 1) / longer);
}

void write_overlay(
    const std::string& dir,
    int64_t volume,
    const float* image,
    const int64_t* label,
    const int64_t* pred,
    int64_t h,
    int64_t w) {
  make_directories(dir);
  char name[32];
  std::snprintf(name, sizeof name, "/case-%03lld.png", (long long)volume);
  write_png(
      dir + name,
      compose_overlay(image, label, pred, h, w, overlay_scale(h, w)));
}

}  // namespace memtrain
