// JPEG and PNG decoding (libjpeg-turbo, libpng) to 8-bit RGB, and the
// resize + centre crop of memtrain convert-images. Both libraries report
// errors by longjmp to a setjmp in the decoding function: each such
// function keeps its state in a context object owned by its caller (no
// automatic C++ object of its own lives across the setjmp), so the jump
// skips no destructor.

// jpeglib.h needs size_t and FILE declared before it.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
// jerror.h after jpeglib.h: the message codes (JWRN_JPEG_EOF).
#include <jerror.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/formats/images/image_decode.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// Larger images are refused before their pixels are allocated (3 bytes
// a pixel: 768 MiB); PIL refuses twice its MAX_IMAGE_PIXELS, 178,956,970.
constexpr uint64_t kMaxPixels = uint64_t{1} << 28;

std::string too_large(uint64_t w, uint64_t h) {
  return std::to_string(w) + "x" + std::to_string(h) +
         " pixels, more than the " + std::to_string(kMaxPixels) +
         " this converter decodes";
}

// --- JPEG ---------------------------------------------------------------

struct JpegContext {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  char warning[JMSG_LENGTH_MAX] = {0};
  bool finishing = false;
  std::vector<uint8_t> row;
  const std::string* bytes = nullptr;
  RgbImage* out = nullptr;
};

JpegContext* jpeg_context(j_common_ptr c) {
  return static_cast<JpegContext*>(c->client_data);
}

[[noreturn]] void jpeg_fail(j_common_ptr c) {
  JpegContext* ctx = jpeg_context(c);
  (*c->err->format_message)(c, ctx->message);
  std::longjmp(ctx->jump, 1);
}

// Warnings (level -1) of corrupt but decodable data are kept; the end of
// the data before the image is complete (libjpeg would fill the rest with
// grey) is a truncated file: an error. Trace messages are dropped.
void jpeg_message(j_common_ptr c, int level) {
  if (level >= 0)
    return;
  JpegContext* ctx = jpeg_context(c);
  if (c->err->msg_code == JWRN_JPEG_EOF && !ctx->finishing)
    jpeg_fail(c);
  if (ctx->warning[0] == 0)
    (*c->err->format_message)(c, ctx->warning);
  c->err->num_warnings++;
}

// C = 255 - c as stored by most writers; Adobe's files store c itself.
uint8_t cmyk_channel(int c, int k, bool adobe) {
  const int v = adobe ? c * k : (255 - c) * (255 - k);
  return static_cast<uint8_t>((v + 127) / 255);
}

// Decodes ctx->bytes into ctx->out; false with ctx->message on error.
bool run_jpeg(JpegContext* ctx) {
  jpeg_decompress_struct* ci = &ctx->cinfo;
  ci->err = jpeg_std_error(&ctx->mgr);
  ci->client_data = ctx;  // kept by jpeg_create_decompress
  ctx->mgr.error_exit = jpeg_fail;
  ctx->mgr.emit_message = jpeg_message;
  if (setjmp(ctx->jump)) {
    jpeg_destroy_decompress(ci);
    return false;
  }
  jpeg_create_decompress(ci);
  jpeg_mem_src(
      ci,
      reinterpret_cast<const unsigned char*>(ctx->bytes->data()),
      static_cast<unsigned long>(ctx->bytes->size()));
  jpeg_read_header(ci, TRUE);
  const J_COLOR_SPACE in_space = ci->jpeg_color_space;
  const bool cmyk = in_space == JCS_CMYK || in_space == JCS_YCCK;
  ci->out_color_space = cmyk                        ? JCS_CMYK
                        : in_space == JCS_GRAYSCALE ? JCS_GRAYSCALE
                                                    : JCS_RGB;
  if (uint64_t{ci->image_width} * ci->image_height > kMaxPixels) {
    std::snprintf(
        ctx->message,
        sizeof(ctx->message),
        "%s",
        too_large(ci->image_width, ci->image_height).c_str());
    jpeg_destroy_decompress(ci);
    return false;
  }
  jpeg_start_decompress(ci);
  const size_t w = ci->output_width, comps = ci->output_components;
  ctx->out->width = static_cast<int64_t>(w);
  ctx->out->height = static_cast<int64_t>(ci->output_height);
  ctx->out->rgb.resize(w * ci->output_height * 3);
  ctx->row.resize(w * comps);
  const bool adobe = ci->saw_Adobe_marker;
  while (ci->output_scanline < ci->output_height) {
    uint8_t* dst = ctx->out->rgb.data() + ci->output_scanline * w * 3;
    if (comps == 3) {  // RGB: straight into the image
      JSAMPROW r = dst;
      jpeg_read_scanlines(ci, &r, 1);
      continue;
    }
    JSAMPROW r = ctx->row.data();
    jpeg_read_scanlines(ci, &r, 1);
    const uint8_t* s = ctx->row.data();
    for (size_t x = 0; x < w; ++x, dst += 3) {
      if (comps == 1) {
        dst[0] = dst[1] = dst[2] = s[x];
      } else {
        const uint8_t* p = s + 4 * x;
        for (int ch = 0; ch < 3; ++ch)
          dst[ch] = cmyk_channel(p[ch], p[3], adobe);
      }
    }
  }
  // A file whose image is complete but whose end marker is missing decodes.
  ctx->finishing = true;
  jpeg_finish_decompress(ci);
  jpeg_destroy_decompress(ci);
  return true;
}

// --- PNG ----------------------------------------------------------------

struct PngContext {
  png_structp png = nullptr;
  png_infop info = nullptr;
  char message[256] = {0};
  char why[128] = {0};
  const std::string* bytes = nullptr;
  size_t pos = 0;
  std::vector<png_bytep> rows;
  RgbImage* out = nullptr;
};

[[noreturn]] void png_fail(png_structp png, png_const_charp msg) {
  auto* ctx = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(ctx->message, sizeof(ctx->message), "%s", msg);
  png_longjmp(png, 1);
}

void png_ignore_warning(png_structp, png_const_charp) {}

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* ctx = static_cast<PngContext*>(png_get_io_ptr(png));
  if (ctx->bytes->size() - ctx->pos < n)
    png_error(png, "truncated file (the data ends inside a chunk)");
  std::memcpy(out, ctx->bytes->data() + ctx->pos, n);
  ctx->pos += n;
}

bool run_png(PngContext* ctx) {
  ctx->png = png_create_read_struct(
      PNG_LIBPNG_VER_STRING, ctx, png_fail, png_ignore_warning);
  ctx->info = ctx->png ? png_create_info_struct(ctx->png) : nullptr;
  if (!ctx->png || !ctx->info) {
    png_destroy_read_struct(&ctx->png, nullptr, nullptr);
    std::snprintf(ctx->message, sizeof(ctx->message), "out of memory");
    return false;
  }
  if (setjmp(png_jmpbuf(ctx->png))) {
    png_destroy_read_struct(&ctx->png, &ctx->info, nullptr);
    return false;
  }
  png_set_read_fn(ctx->png, ctx, png_read_bytes);
  png_read_info(ctx->png, ctx->info);
  const png_uint_32 w = png_get_image_width(ctx->png, ctx->info);
  const png_uint_32 h = png_get_image_height(ctx->png, ctx->info);
  if (uint64_t{w} * h > kMaxPixels) {
    // Formatted before png_error: its longjmp would skip a string's
    // destructor.
    std::snprintf(ctx->why, sizeof(ctx->why), "%s", too_large(w, h).c_str());
    png_error(ctx->png, ctx->why);
  }
  png_set_expand(ctx->png);  // palette -> RGB, gray < 8 bits -> 8, tRNS
  png_set_strip_16(ctx->png);
  png_set_strip_alpha(ctx->png);
  png_set_gray_to_rgb(ctx->png);
  png_set_interlace_handling(ctx->png);
  png_read_update_info(ctx->png, ctx->info);
  if (png_get_rowbytes(ctx->png, ctx->info) != size_t{w} * 3)
    png_error(ctx->png, "unexpected row size after conversion to RGB");
  ctx->out->width = w;
  ctx->out->height = h;
  ctx->out->rgb.resize(size_t{w} * h * 3);
  ctx->rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y)
    ctx->rows[y] = ctx->out->rgb.data() + size_t{y} * w * 3;
  png_read_image(ctx->png, ctx->rows.data());
  // Not png_read_end: the pixels are complete; what follows IDAT
  // (text, the end chunk) is not needed.
  png_destroy_read_struct(&ctx->png, &ctx->info, nullptr);
  return true;
}

// --- resizing -----------------------------------------------------------

// Output positions [first, first + n) of a resize from `in` to `out`
// samples: for each, the input range and its normalised weights (PIL's
// precompute_coeffs with the bilinear filter).
struct Taps {
  std::vector<int64_t> start, count;
  std::vector<float> w;  // max_taps per output
  int64_t max_taps = 0;
};

Taps make_taps(int64_t in, int64_t out, int64_t first, int64_t n) {
  const double scale = static_cast<double>(in) / out;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // the triangle's radius is 1
  Taps t;
  t.max_taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  t.start.resize(n);
  t.count.resize(n);
  t.w.assign(n * t.max_taps, 0.0f);
  std::vector<double> k(t.max_taps);
  for (int64_t i = 0; i < n; ++i) {
    const double center = (first + i + 0.5) * scale;
    int64_t lo = static_cast<int64_t>(center - support + 0.5);  // truncates
    int64_t hi = static_cast<int64_t>(center + support + 0.5);
    lo = std::max<int64_t>(lo, 0);
    hi = std::min(hi, in);
    const int64_t count = std::min(hi - lo, t.max_taps);
    double sum = 0;
    for (int64_t x = 0; x < count; ++x) {
      const double d = std::fabs((x + lo - center + 0.5) / filter_scale);
      k[x] = d < 1.0 ? 1.0 - d : 0.0;
      sum += k[x];
    }
    for (int64_t x = 0; x < count; ++x)
      t.w[i * t.max_taps + x] = static_cast<float>(sum != 0 ? k[x] / sum : 0);
    t.start[i] = lo;
    t.count[i] = count;
  }
  return t;
}

// round((a - b) / 2) with Python's round (half to even).
int64_t centre_offset(int64_t a, int64_t b) {
  return static_cast<int64_t>(std::nearbyint((a - b) / 2.0));
}

}  // namespace

RgbImage decode_image(const std::string& bytes, std::string* warning) {
  static const unsigned char kPng[8] = {
      0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  RgbImage out;
  if (bytes.empty())
    throw Error("empty file (0 bytes)");
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  if (bytes.size() >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff) {
    auto ctx = std::make_unique<JpegContext>();
    ctx->bytes = &bytes;
    ctx->out = &out;
    if (!run_jpeg(ctx.get()))
      throw Error(std::string("JPEG (libjpeg): ") + ctx->message);
    if (warning && ctx->warning[0])
      *warning = std::string("JPEG (libjpeg): ") + ctx->warning;
    return out;
  }
  if (bytes.size() >= 8 && std::memcmp(b, kPng, 8) == 0) {
    auto ctx = std::make_unique<PngContext>();
    ctx->bytes = &bytes;
    ctx->out = &out;
    if (!run_png(ctx.get()))
      throw Error(std::string("PNG (libpng): ") + ctx->message);
    return out;
  }
  std::string head;
  for (size_t i = 0; i < std::min<size_t>(bytes.size(), 8); ++i) {
    char hex[4];
    std::snprintf(hex, sizeof(hex), "%s%02x", i ? " " : "", b[i]);
    head += hex;
  }
  throw Error("not a JPEG or PNG file (its first bytes are " + head + ")");
}

std::vector<uint8_t> resize_center_crop(const RgbImage& im, int64_t size) {
  MT_INTERNAL_ASSERT(
      im.width > 0 && im.height > 0 && size > 0 &&
          im.rgb.size() == static_cast<size_t>(im.width * im.height * 3),
      "resize_center_crop: image size");
  // torchvision's _compute_resized_output_size: int() truncates.
  int64_t new_w = size, new_h = size;
  if (im.width <= im.height)
    new_h =
        static_cast<int64_t>(static_cast<double>(size) * im.height / im.width);
  else
    new_w =
        static_cast<int64_t>(static_cast<double>(size) * im.width / im.height);
  const int64_t left = centre_offset(new_w, size);
  const int64_t top = centre_offset(new_h, size);
  const Taps tx = make_taps(im.width, new_w, left, size);
  const Taps ty = make_taps(im.height, new_h, top, size);
  // Horizontal pass over the input rows the vertical taps touch.
  const int64_t row0 = ty.start.front();
  const int64_t row1 = ty.start.back() + ty.count.back();
  std::vector<float> mid(static_cast<size_t>((row1 - row0) * size * 3));
  for (int64_t y = row0; y < row1; ++y) {
    const uint8_t* src = im.rgb.data() + y * im.width * 3;
    float* dst = mid.data() + (y - row0) * size * 3;
    for (int64_t x = 0; x < size; ++x) {
      const float* w = tx.w.data() + x * tx.max_taps;
      const uint8_t* s = src + tx.start[x] * 3;
      float r = 0, g = 0, b = 0;
      for (int64_t k = 0; k < tx.count[x]; ++k) {
        r += w[k] * s[3 * k];
        g += w[k] * s[3 * k + 1];
        b += w[k] * s[3 * k + 2];
      }
      dst[3 * x] = r;
      dst[3 * x + 1] = g;
      dst[3 * x + 2] = b;
    }
  }
  std::vector<uint8_t> out(static_cast<size_t>(3 * size * size));
  const size_t plane = static_cast<size_t>(size * size);
  std::vector<float> acc(static_cast<size_t>(size * 3));
  for (int64_t y = 0; y < size; ++y) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    const float* w = ty.w.data() + y * ty.max_taps;
    for (int64_t k = 0; k < ty.count[y]; ++k) {
      const float* s = mid.data() + (ty.start[y] + k - row0) * size * 3;
      for (int64_t i = 0; i < size * 3; ++i)
        acc[i] += w[k] * s[i];
    }
    for (int64_t x = 0; x < size; ++x)
      for (int64_t c = 0; c < 3; ++c) {
        const float v = std::nearbyint(acc[3 * x + c]);
        out[c * plane + y * size + x] =
            static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
      }
  }
  return out;
}

}  // namespace memtrain
