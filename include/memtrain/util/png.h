#pragma once
// 8-bit RGB PNG files through libpng; no LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct RgbImage {
  int64_t width = 0;
  int64_t height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel
};

// The PNG file's bytes. Throws memtrain::Error when libpng fails.
std::string encode_png(const RgbImage& image);
// Written with write_file_atomically: never half-written.
void write_png(const std::string& path, const RgbImage& image);

}  // namespace memtrain
