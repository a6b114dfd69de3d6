// memtrain convert-images: PNG files written with libpng and JPEG files with
// libjpeg's compressor, of known pixels, decoded, resized, converted and
// read back (HDF5 C API and memtrain's own reader).

#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/stat.h>

// jpeglib.h needs size_t and FILE declared before it.
#include <cstddef>
#include <cstdio>

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "memtrain/convert/image_convert.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/formats/images/image_decode.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {
namespace fs = std::filesystem;

struct Png {
  int width = 0, height = 0;
  int color_type = PNG_COLOR_TYPE_RGB;
  int bit_depth = 8;
  std::vector<uint8_t> bytes;  // rows as libpng takes them (16 bit: big end)
  std::vector<png_color> palette;
  std::vector<uint8_t> trans;  // palette alpha
};

std::string encode(const Png& p) {
  std::string out;
  png_structp png =
      png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png)))
    ADD_FAILURE() << "libpng failed to write a test image";
  png_set_write_fn(
      png,
      &out,
      [](png_structp s, png_bytep d, png_size_t n) {
        static_cast<std::string*>(png_get_io_ptr(s))
            ->append(reinterpret_cast<const char*>(d), n);
      },
      nullptr);
  png_set_IHDR(
      png,
      info,
      p.width,
      p.height,
      p.bit_depth,
      p.color_type,
      PNG_INTERLACE_NONE,
      PNG_COMPRESSION_TYPE_DEFAULT,
      PNG_FILTER_TYPE_DEFAULT);
  if (!p.palette.empty())
    png_set_PLTE(png, info, p.palette.data(), int(p.palette.size()));
  if (!p.trans.empty())
    png_set_tRNS(png, info, p.trans.data(), int(p.trans.size()), nullptr);
  png_write_info(png, info);
  const size_t row = p.bytes.size() / p.height;
  for (int y = 0; y < p.height; ++y)
    png_write_row(png, const_cast<png_bytep>(p.bytes.data() + y * row));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

// comps 1 (gray), 3 (RGB) or 4 (CMYK, written with an Adobe marker).
std::string encode_jpeg(
    int w, int h, int comps, const std::vector<uint8_t>& px, int quality) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = w;
  c.image_height = h;
  c.input_components = comps;
  c.in_color_space = comps == 1   ? JCS_GRAYSCALE
                     : comps == 3 ? JCS_RGB
                                  : JCS_CMYK;
  jpeg_set_defaults(&c);
  jpeg_set_quality(&c, quality, TRUE);
  jpeg_start_compress(&c, TRUE);
  for (int y = 0; y < h; ++y) {
    JSAMPROW r = const_cast<JSAMPROW>(px.data() + size_t(y) * w * comps);
    jpeg_write_scanlines(&c, &r, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  std::string out(reinterpret_cast<char*>(buf), size);
  free(buf);
  return out;
}

void put(const std::string& path, const std::string& bytes) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

Png rgb(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  Png p;
  p.width = w;
  p.height = h;
  for (int i = 0; i < w * h; ++i)
    p.bytes.insert(p.bytes.end(), {r, g, b});
  return p;
}

// Byte i is (7i + 3) mod 256: neighbours differ in a small image.
Png ramp(int w, int h) {
  Png p;
  p.width = w;
  p.height = h;
  for (int i = 0; i < w * h * 3; ++i)
    p.bytes.push_back(static_cast<uint8_t>((i * 7 + 3) % 256));
  return p;
}

std::vector<uint8_t> read_u8(
    const std::string& path, const char* name, std::vector<hsize_t>* dims) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  dims->assign(H5Sget_simple_extent_ndims(s), 0);
  H5Sget_simple_extent_dims(s, dims->data(), nullptr);
  hsize_t n = 1;
  for (auto x : *dims)
    n *= x;
  std::vector<uint8_t> v(n);
  EXPECT_GE(
      H5Dread(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0);
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  return v;
}

std::vector<int64_t> read_labels(const std::string& path) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "labels", H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  std::vector<int64_t> v(H5Sget_simple_extent_npoints(s));
  H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  return v;
}

std::string decode_error(const std::string& bytes) {
  return test::error_of([&] { decode_image(bytes); });
}

TEST(ImageDecode, PngRgbExactAndResizedToItsOwnSizeUnchanged) {
  const Png p = ramp(9, 9);
  const RgbImage im = decode_image(encode(p));
  ASSERT_EQ(im.width, 9);
  ASSERT_EQ(im.height, 9);
  EXPECT_EQ(im.rgb, p.bytes);
  const std::vector<uint8_t> out = resize_center_crop(im, 9);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 81; ++i)
      ASSERT_EQ(out[c * 81 + i], p.bytes[i * 3 + c]) << c << " " << i;
}

TEST(ImageDecode, ConstantColourStaysExactWhenShrunkOrEnlarged) {
  for (auto [w, h, s] :
       {std::array<int, 3>{37, 23, 16}, {5, 7, 16}, {300, 4, 3}}) {
    const RgbImage im = decode_image(encode(rgb(w, h, 201, 7, 99)));
    const std::vector<uint8_t> out = resize_center_crop(im, s);
    ASSERT_EQ(out.size(), size_t(3 * s * s));
    for (int i = 0; i < s * s; ++i) {
      ASSERT_EQ(out[i], 201) << w << "x" << h;
      ASSERT_EQ(out[s * s + i], 7);
      ASSERT_EQ(out[2 * s * s + i], 99);
    }
  }
}

TEST(ImageDecode, ResizeIsPilsAntialiasedBilinearAndCropRoundsHalfToEven) {
  // 4x4 -> 2x2: output 0 = (3a + 3b + c) / 7, output 1 = (b + 3c + 3d) / 7
  // (triangle of radius 2 centred at 1.0 and 3.0, weights normalised).
  Png p;
  p.width = p.height = 4;
  const uint8_t row[4] = {0, 70, 140, 210};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 4; ++x)
      p.bytes.insert(p.bytes.end(), {row[x], row[x], row[x]});
  std::vector<uint8_t> out = resize_center_crop(decode_image(encode(p)), 2);
  EXPECT_EQ(out[0], 50);   // 350 / 7
  EXPECT_EQ(out[1], 160);  // 1120 / 7
  EXPECT_EQ(out[2], 50);
  EXPECT_EQ(out[3], 160);
  // 6x3 at size 3: no resize (shorter side 3), crop left round(1.5) = 2.
  const Png r = ramp(6, 3);
  out = resize_center_crop(decode_image(encode(r)), 3);
  for (int y = 0; y < 3; ++y)
    for (int x = 0; x < 3; ++x)
      for (int c = 0; c < 3; ++c)
        ASSERT_EQ(out[c * 9 + y * 3 + x], r.bytes[(y * 6 + x + 2) * 3 + c]);
}

TEST(ImageDecode, GrayPaletteAlphaAnd16BitBecomeRgb) {
  Png g;
  g.width = 2;
  g.height = 1;
  g.color_type = PNG_COLOR_TYPE_GRAY;
  g.bytes = {17, 230};
  EXPECT_EQ(
      decode_image(encode(g)).rgb,
      (std::vector<uint8_t>{17, 17, 17, 230, 230, 230}));
  // Alpha dropped, not composited: a transparent pixel keeps its colour.
  Png a;
  a.width = 2;
  a.height = 1;
  a.color_type = PNG_COLOR_TYPE_RGB_ALPHA;
  a.bytes = {10, 20, 30, 0, 40, 50, 60, 255};
  EXPECT_EQ(
      decode_image(encode(a)).rgb,
      (std::vector<uint8_t>{10, 20, 30, 40, 50, 60}));
  Png ga;
  ga.width = 1;
  ga.height = 1;
  ga.color_type = PNG_COLOR_TYPE_GRAY_ALPHA;
  ga.bytes = {99, 3};
  EXPECT_EQ(decode_image(encode(ga)).rgb, (std::vector<uint8_t>{99, 99, 99}));
  Png pal;
  pal.width = 3;
  pal.height = 1;
  pal.color_type = PNG_COLOR_TYPE_PALETTE;
  pal.palette = {{1, 2, 3}, {250, 128, 0}};
  pal.trans = {255, 0};  // palette transparency: dropped too
  pal.bytes = {1, 0, 1};
  EXPECT_EQ(
      decode_image(encode(pal)).rgb,
      (std::vector<uint8_t>{250, 128, 0, 1, 2, 3, 250, 128, 0}));
  // 16 bit: the high byte (0x12 of 0x12ff), as PIL reads 16-bit RGB.
  Png d;
  d.width = 1;
  d.height = 1;
  d.bit_depth = 16;
  d.bytes = {0x12, 0xff, 0xab, 0x01, 0x00, 0x80};
  EXPECT_EQ(
      decode_image(encode(d)).rgb, (std::vector<uint8_t>{0x12, 0xab, 0x00}));
}

TEST(ImageDecode, JpegRgbAndGrayAndMagicBytesNotTheName) {
  std::vector<uint8_t> px;
  for (int i = 0; i < 16 * 8; ++i)
    px.insert(px.end(), {200, 100, 50});
  const RgbImage im = decode_image(encode_jpeg(16, 8, 3, px, 100));
  ASSERT_EQ(im.width, 16);
  ASSERT_EQ(im.height, 8);
  for (size_t i = 0; i < im.rgb.size(); i += 3) {
    ASSERT_NEAR(im.rgb[i], 200, 2);
    ASSERT_NEAR(im.rgb[i + 1], 100, 2);
    ASSERT_NEAR(im.rgb[i + 2], 50, 2);
  }
  const std::vector<uint8_t> gray(8 * 8, 77);
  const RgbImage g = decode_image(encode_jpeg(8, 8, 1, gray, 95));
  for (size_t i = 0; i < g.rgb.size(); i += 3) {
    ASSERT_EQ(g.rgb[i], g.rgb[i + 1]);
    ASSERT_EQ(g.rgb[i], g.rgb[i + 2]);
    ASSERT_NEAR(g.rgb[i], 77, 1);
  }
  // CMYK with Adobe's marker stores inverted inks: R = C K / 255, ...
  std::vector<uint8_t> cmyk;
  for (int i = 0; i < 8 * 8; ++i)
    cmyk.insert(cmyk.end(), {255, 128, 0, 255});
  const RgbImage k = decode_image(encode_jpeg(8, 8, 4, cmyk, 100));
  for (size_t i = 0; i < k.rgb.size(); i += 3) {
    ASSERT_NEAR(k.rgb[i], 255, 2);
    ASSERT_NEAR(k.rgb[i + 1], 128, 2);
    ASSERT_NEAR(k.rgb[i + 2], 0, 2);
  }
}

TEST(ImageDecode, BrokenFilesGiveTheDecodersMessage) {
  std::vector<uint8_t> noise(64 * 64 * 3);
  for (size_t i = 0; i < noise.size(); ++i)
    noise[i] = static_cast<uint8_t>(i * 2654435761u >> 7);
  const std::string jpg = encode_jpeg(64, 64, 3, noise, 90);
  EXPECT_NE(
      decode_error(jpg.substr(0, jpg.size() / 2))
          .find("JPEG (libjpeg): Premature end of JPEG file"),
      std::string::npos);
  EXPECT_NE(
      decode_error(jpg.substr(0, 40)).find("JPEG (libjpeg): "),
      std::string::npos);
  const std::string png = encode(ramp(20, 20));
  EXPECT_NE(
      decode_error(png.substr(0, png.size() - 40)).find("PNG (libpng): "),
      std::string::npos);
  EXPECT_EQ(decode_error(""), "empty file (0 bytes)");
  EXPECT_EQ(
      decode_error("hello, world"),
      "not a JPEG or PNG file (its first bytes are 68 65 6c 6c 6f 2c 20 77)");
}

// A folder with every case; returns the spec converting it into dir/out.
ImageConvertSpec make_folder(const test::TempDir& dir) {
  const std::string f = dir.file("images");
  // Classes sort by byte value: "B" < "a" < "c".
  put(f + "/a/1.png", encode(rgb(12, 10, 255, 0, 0)));
  Png gray;
  gray.width = gray.height = 8;
  gray.color_type = PNG_COLOR_TYPE_GRAY;
  gray.bytes.assign(64, 90);
  put(f + "/a/2.PNG", encode(gray));
  put(f + "/a/3.png", "");  // zero bytes: skipped
  put(f + "/a/notes.txt", "not an image");
  put(f + "/a/.hidden.png", encode(rgb(8, 8, 1, 1, 1)));
  std::vector<uint8_t> px(16 * 16 * 3, 40);
  const std::string jpg = encode_jpeg(16, 16, 3, px, 100);
  put(f + "/B/x.jpg", jpg);
  put(f + "/B/y.jpeg", jpg.substr(0, jpg.size() / 2));  // truncated: skipped
  put(f + "/B/z.png", jpg);  // a JPEG named .png: decoded as JPEG
  Png rgba;
  rgba.width = rgba.height = 8;
  rgba.color_type = PNG_COLOR_TYPE_RGB_ALPHA;
  for (int i = 0; i < 64; ++i)
    rgba.bytes.insert(rgba.bytes.end(), {0, 0, 250, 0});
  for (int i = 0; i < 10; ++i)
    put(f + "/c/sub/" + std::to_string(i) + ".png", encode(rgba));
  put(f + "/.git/1.png", encode(rgb(8, 8, 1, 1, 1)));  // hidden: no class
  ImageConvertSpec spec;
  spec.folder = f;
  spec.out = dir.file("out/train.h5");
  spec.size = 4;
  spec.val_fraction = 0.3;
  spec.seed = 5;
  fs::create_directories(dir.file("out"));
  return spec;
}

TEST(ImageConvert, FolderToTrainAndValFiles) {
  test::TempDir dir("images");
  const ImageConvertSpec spec = make_folder(dir);
  std::vector<std::string> lines;
  const ImageConvertResult r =
      convert_images(spec, [&](const std::string& l) { lines.push_back(l); });
  EXPECT_EQ(r.class_names, (std::vector<std::string>{"B", "a", "c"}));
  // Per class round(0.3 n): B 2 -> 1, a 2 -> 1, c 10 -> 3.
  EXPECT_EQ(r.train_per_class, (std::vector<int64_t>{1, 1, 7}));
  EXPECT_EQ(r.val_per_class, (std::vector<int64_t>{1, 1, 3}));
  ASSERT_EQ(r.skipped.size(), 2u);
  EXPECT_EQ(r.skipped[0].path, spec.folder + "/B/y.jpeg");
  EXPECT_EQ(r.skipped[0].reason, "JPEG (libjpeg): Premature end of JPEG file");
  EXPECT_EQ(r.skipped[1].path, spec.folder + "/a/3.png");
  EXPECT_EQ(r.skipped[1].reason, "empty file (0 bytes)");
  EXPECT_EQ(r.ignored, 1);
  EXPECT_EQ(r.ignored_extensions, (std::vector<std::string>{".txt"}));
  EXPECT_EQ(r.hidden, 1);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "class 0 'B': 2 images (1 train, 1 val), 1 skipped");
  EXPECT_EQ(r.val_path, dir.file("out/train-val.h5"));
  for (const auto& e : fs::directory_iterator(dir.file("out")))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();

  // Labels in class order; pixels: the colours (alpha dropped, gray
  // replicated), exact for the PNGs after resizing.
  std::vector<hsize_t> dims;
  const std::vector<uint8_t> px = read_u8(r.train_path, "images", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{9, 3, 4, 4}));
  EXPECT_EQ(
      read_labels(r.train_path),
      (std::vector<int64_t>{0, 1, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_NEAR(px[0], 40, 2);  // B's JPEG
  // Class a's training image is its red PNG or its grey one (the draw).
  const std::set<uint8_t> a_px = {px[48], px[48 + 16], px[48 + 32]};
  const bool red = px[48] == 255 && px[64] == 0 && px[80] == 0;
  const bool grey = a_px == std::set<uint8_t>{90};
  EXPECT_TRUE(red || grey) << int(px[48]) << " " << int(px[64]);
  for (int i = 2; i < 9; ++i) {
    const uint8_t* s = px.data() + i * 48;
    for (int k = 0; k < 16; ++k)
      ASSERT_TRUE(s[k] == 0 && s[16 + k] == 0 && s[32 + k] == 250) << i;
  }
  // memtrain's reader accepts both, with the class names and counts.
  const H5Dataset train = H5Dataset::open(r.train_path, "data.train");
  EXPECT_EQ(train.info().num_classes, 3);
  EXPECT_EQ(train.info().class_names, r.class_names);
  EXPECT_EQ(train.info().label_counts, (std::vector<int64_t>{1, 1, 7}));
  EXPECT_TRUE(train.info().checksummed);
  const H5Dataset val = H5Dataset::open(r.val_path, "data.val");
  EXPECT_EQ(val.info().label_counts, (std::vector<int64_t>{1, 1, 3}));
  hid_t f = H5Fopen(r.val_path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "images", H5P_DEFAULT);
  hid_t pl = H5Dget_create_plist(d);
  hsize_t chunk[4] = {0, 0, 0, 0};
  EXPECT_EQ(H5Pget_chunk(pl, 4, chunk), 4);
  EXPECT_EQ(chunk[0], 1u);
  EXPECT_EQ(chunk[3], 4u);
  H5Pclose(pl);
  H5Dclose(d);
  H5Fclose(f);
}

TEST(ImageConvert, SplitIsTheDocumentedSeededDraw) {
  // The rule by hand: per class, the round(f n) smallest keys.
  std::vector<std::pair<uint64_t, std::string>> keys;
  for (int i = 0; i < 10; ++i) {
    const std::string rel = "sub/" + std::to_string(i) + ".png";
    keys.push_back({split_key(rel, 5), rel});
  }
  std::sort(keys.begin(), keys.end());
  std::set<std::string> want_val = {
      keys[0].second, keys[1].second, keys[2].second};
  EXPECT_EQ(val_count(10, 0.3), 3);
  EXPECT_EQ(val_count(15, 0.1), 2);  // 1.5000000000000002
  EXPECT_EQ(val_count(1, 0.4), 0);
  EXPECT_NE(split_key("a.png", 0), split_key("a.png", 1));

  // Class c's images differ only by name, so tag them by colour: image i
  // is grey i * 20.
  test::TempDir dir("images-split");
  const std::string f = dir.file("images");
  for (int i = 0; i < 10; ++i) {
    const auto v = static_cast<uint8_t>(i * 20);
    put(f + "/c/sub/" + std::to_string(i) + ".png", encode(rgb(5, 5, v, v, v)));
  }
  ImageConvertSpec spec;
  spec.folder = f;
  spec.out = dir.file("t.h5");
  spec.size = 2;
  spec.val_fraction = 0.3;
  spec.seed = 5;
  const ImageConvertResult r = convert_images(spec);
  std::vector<hsize_t> dims;
  std::set<std::string> got_val;
  const std::vector<uint8_t> v = read_u8(r.val_path, "images", &dims);
  for (size_t i = 0; i < dims[0]; ++i)
    got_val.insert("sub/" + std::to_string(v[i * 12] / 20) + ".png");
  EXPECT_EQ(got_val, want_val);
  // The same seed: the same bytes; another seed: another draw.
  const std::vector<uint8_t> again = read_u8(r.val_path, "images", &dims);
  convert_images(spec);
  EXPECT_EQ(read_u8(r.val_path, "images", &dims), again);
  spec.seed = 6;
  convert_images(spec);
  EXPECT_NE(read_u8(r.val_path, "images", &dims), again);
  // --val-fraction 0: the training file only, with every image.
  spec.val_fraction = 0;
  spec.out = dir.file("all.h5");
  const ImageConvertResult all = convert_images(spec);
  EXPECT_EQ(all.val_path, "");
  EXPECT_FALSE(fs::exists(dir.file("all-val.h5")));
  EXPECT_EQ(read_labels(all.train_path).size(), 10u);
}

// An image's name on a FIFO or a symbolic link that leads nowhere is skipped
// with its reason like an undecodable file (never opened: a FIFO would
// block), not dropped unsaid; such an entry with another extension counts
// as ignored.
TEST(ImageConvert, FifosAndDeadLinksAreSkippedWithTheirReason) {
  test::TempDir dir("images-special");
  const ImageConvertSpec spec = make_folder(dir);
  const std::string c = spec.folder + "/c/";
  ASSERT_EQ(::mkfifo((c + "pipe.jpg").c_str(), 0600), 0);
  ASSERT_EQ(::mkfifo((c + "pipe.txt").c_str(), 0600), 0);
  fs::create_symlink("loop.png", c + "loop.png");
  fs::create_symlink("nowhere.jpg", c + "dead.jpeg");
  const ImageConvertResult r = convert_images(spec);
  std::map<std::string, std::string> why;
  for (const SkippedImage& s : r.skipped)
    why[s.path] = s.reason;
  ASSERT_EQ(why.size(), 5u);  // the two of make_folder and these three
  EXPECT_EQ(why[c + "pipe.jpg"], "a FIFO, not a regular file");
  EXPECT_EQ(
      why[c + "loop.png"],
      "a symbolic link loop (Too many levels of symbolic links)");
  EXPECT_EQ(
      why[c + "dead.jpeg"],
      "a broken symbolic link (its target does not exist)");
  EXPECT_EQ(r.ignored, 2);  // a/notes.txt and c/pipe.txt
  EXPECT_EQ(r.train_per_class[2] + r.val_per_class[2], 10);
}

TEST(ImageConvert, FailuresLeaveExistingOutputsAlone) {
  test::TempDir dir("images-bad");
  ImageConvertSpec spec = make_folder(dir);
  put(spec.out, "old training file");
  put(dir.file("out/train-val.h5"), "old validation file");
  put(spec.folder + "/d/broken.png", "");  // a class with no readable image
  EXPECT_EQ(
      test::error_of([&] { convert_images(spec); }),
      "convert-images: 1 class folder(s) without a readable image (.jpg, "
      ".jpeg or .png): '" +
          spec.folder +
          "/d'; add images or remove the "
          "folder (its label would never occur)");
  std::ifstream in(spec.out);
  EXPECT_EQ(
      std::string(std::istreambuf_iterator<char>(in), {}), "old training file");
  std::ifstream inv(dir.file("out/train-val.h5"));
  EXPECT_EQ(
      std::string(std::istreambuf_iterator<char>(inv), {}),
      "old validation file");
  for (const auto& e : fs::directory_iterator(dir.file("out")))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();

  fs::remove_all(spec.folder + "/d");
  put(spec.folder + "/x,y/1.png", encode(rgb(4, 4, 1, 2, 3)));
  EXPECT_NE(
      test::error_of([&] {
        convert_images(spec);
      }).find("its name has a comma"),
      std::string::npos);
  spec.folder = dir.file("missing");
  EXPECT_EQ(
      test::error_of([&] { convert_images(spec); }),
      "convert-images: --folder '" + spec.folder + "': no such folder");
  spec.folder = dir.file("out");  // files only, no subfolder
  EXPECT_NE(
      test::error_of([&] {
        convert_images(spec);
      }).find("has no class subfolders"),
      std::string::npos);
  test::TempDir unreadable("images-none");
  put(unreadable.file("k/a.png"), "x");
  spec.folder = unreadable.path();
  EXPECT_NE(
      test::error_of([&] {
        convert_images(spec);
      }).find("no readable image (1 .jpg/.jpeg/.png files skipped"),
      std::string::npos);
  spec.val_fraction = 1;
  EXPECT_NE(
      test::error_of([&] { convert_images(spec); }).find("is not in [0, 1)"),
      std::string::npos);
}

}  // namespace
}  // namespace memtrain
