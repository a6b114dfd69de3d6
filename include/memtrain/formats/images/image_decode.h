#pragma once
// Image files read to 8-bit RGB (libjpeg-turbo, libpng), and torchvision's
// resize + centre crop: the reader convert-images and convert-captions use.
// No LibTorch here.

#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/util/png.h"

namespace memtrain {

// The 8-bit RGB image in `bytes`, a JPEG or PNG file (told apart by its
// signature, not its name). Grayscale is replicated to RGB; alpha (RGBA,
// gray + alpha, a palette's or tRNS transparency) is dropped, not
// composited: the colour values are kept as they are, as PIL's
// convert("RGB") does; 16-bit PNG samples keep their high byte; palettes
// are expanded; CMYK and YCCK JPEGs are converted (Adobe's inverted CMYK
// recognised). Throws memtrain::Error with the decoder's message. A
// non-fatal decoder complaint (corrupt JPEG data that still decodes) is
// put in *warning when given.
RgbImage decode_image(const std::string& bytes, std::string* warning = nullptr);

// torchvision's Resize(size) + CenterCrop(size): the shorter side becomes
// `size` (the longer int(size * long / short)), then the centre size x size
// (offset round((new - size) / 2), half to even). Resampling is PIL's
// bilinear filter with antialiasing: a triangle whose support grows with the
// shrink factor (area-like averaging), separable, weights normalised per
// output pixel, computed in float and rounded once. Returns channels-first
// [3, size, size] uint8.
std::vector<uint8_t> resize_center_crop(const RgbImage& image, int64_t size);

}  // namespace memtrain
