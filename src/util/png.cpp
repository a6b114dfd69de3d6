#include "memtrain/util/png.h"

#include <png.h>

#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

void append(png_structp png, png_bytep data, png_size_t size) {
  auto* out = static_cast<std::string*>(png_get_io_ptr(png));
  out->append(reinterpret_cast<const char*>(data), size);
}

void no_flush(png_structp) {}

}  // namespace

std::string encode_png(const RgbImage& image) {
  MT_INTERNAL_ASSERT(
      image.width > 0 && image.height > 0 &&
          image.rgb.size() == size_t(image.width * image.height * 3),
      "encode_png: image size");
  std::string out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info) {
    png_destroy_write_struct(&png, nullptr);
    throw Error("libpng: cannot allocate a PNG writer");
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw Error("libpng failed to encode a PNG image");
  }
  png_set_write_fn(png, &out, append, no_flush);
  png_set_IHDR(
      png,
      info,
      static_cast<png_uint_32>(image.width),
      static_cast<png_uint_32>(image.height),
      8,
      PNG_COLOR_TYPE_RGB,
      PNG_INTERLACE_NONE,
      PNG_COMPRESSION_TYPE_DEFAULT,
      PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < image.height; ++y) {
    png_write_row(
        png, const_cast<png_bytep>(image.rgb.data() + y * image.width * 3));
  }
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

void write_png(const std::string& path, const RgbImage& image) {
  write_file_atomically(path, encode_png(image));
}

}  // namespace memtrain
