// gzip files read whole with every check of the format (gzip_file.h), and
// the .nii.gz reader refusing a damaged stream that still inflates (issue
// 56, point 6): libnifti reads only the bytes it needs, so zlib never
// reached the CRC-32 and ISIZE of the member's trailer.

#include <gtest/gtest.h>
#include <nifti2_io.h>
#include <zlib.h>

#include <cstring>
#include <fstream>
#include <string>

#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "memtrain/util/gzip_file.h"
#include "test_support.h"

namespace memtrain {
namespace {

using test::error_of;

const std::string kRemedy =
    ": the file is damaged; re-export or re-download it";

// One gzip member of `raw` at `level` (0: stored blocks, the bytes as they
// are).
std::string gzip(const std::string& raw, int level = 6) {
  z_stream zs{};
  EXPECT_EQ(
      deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY),
      Z_OK);
  std::string out(deflateBound(&zs, raw.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

// A level-0 member with the byte of uncompressed offset `at` changed: it
// inflates to the right length, only its CRC-32 differs.
std::string flip_stored(std::string z, size_t at) {
  size_t pos = 10, out = 0;  // after the member header
  for (;;) {
    const size_t n = static_cast<unsigned char>(z[pos + 1]) |
                     static_cast<unsigned char>(z[pos + 2]) << 8;
    if (at < out + n) {
      z[pos + 5 + at - out] ^= 1;
      return z;
    }
    EXPECT_EQ(z[pos] & 1, 0) << "offset past the data";
    pos += 5 + n;
    out += n;
  }
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string inflated(const std::string& path) {
  std::string out;
  read_gzip_file(path, "'" + path + "'", [&](const unsigned char* p, size_t n) {
    out.append(reinterpret_cast<const char*>(p), n);
  });
  return out;
}

std::string text(size_t n) {
  std::string s;
  for (size_t i = 0; s.size() < n; ++i)
    s += std::to_string(i * i) + ",";
  return s.substr(0, n);
}

TEST(GzipFile, MembersAndZeroPaddingAreReadWhole) {
  test::TempDir dir("gz");
  const std::string raw = text(300000);  // several stored blocks and buffers
  const std::string p = dir.file("a.gz");
  for (const int level : {0, 6}) {
    write_file(p, gzip(raw, level));
    EXPECT_TRUE(has_gzip_magic(p));
    EXPECT_EQ(inflated(p), raw) << level;
  }
  // Two members (cat a.gz b.gz), one of them empty, then zero padding.
  write_file(
      p,
      gzip(raw.substr(0, 1000)) + gzip("") + gzip(raw.substr(1000), 0) +
          std::string(20, '\0'));
  EXPECT_EQ(inflated(p), raw);
  write_file(p, raw);
  EXPECT_FALSE(has_gzip_magic(p));
}

TEST(GzipFile, DamageThatStillInflatesIsRefusedSayingWhat) {
  test::TempDir dir("gz");
  const std::string raw = text(300000);
  const std::string p = dir.file("a.gz");
  const std::string who = "'" + p + "'";
  auto refusal = [&](const std::string& bytes) {
    write_file(p, bytes);
    return error_of([&] { inflated(p); });
  };
  EXPECT_EQ(
      refusal(flip_stored(gzip(raw, 0), 200000)),
      who + ": the gzip stream's CRC-32 does not match its data" + kRemedy);
  std::string z = gzip(raw);
  z[z.size() - 4] ^= 1;  // ISIZE
  EXPECT_EQ(
      refusal(z),
      who + ": the gzip stream's length (ISIZE) does not match its data's" +
          kRemedy);
  EXPECT_EQ(
      refusal(
          gzip(raw.substr(0, 10)) + flip_stored(gzip(raw.substr(10), 0), 7)),
      who +
          ": the gzip stream's CRC-32 does not match its data (member 2 of "
          "the stream)" +
          kRemedy);
  const std::string good = gzip(raw);
  EXPECT_EQ(
      refusal(good + "garbage!"),
      who + ": its 8 bytes after the end of the gzip stream (at byte " +
          std::to_string(good.size()) +
          ") are not a gzip member (trailing garbage)" + kRemedy);
  // Zeros, then more: gzread would stop at the zeros.
  EXPECT_EQ(
      refusal(good + std::string(3, '\0') + good),
      who + ": its " + std::to_string(3 + good.size()) +
          " bytes after the end of the gzip stream (at byte " +
          std::to_string(good.size()) +
          ") are not a gzip member (trailing garbage)" + kRemedy);
  EXPECT_EQ(
      refusal(good + std::string("\x1f\0garbage", 9)),
      who + ": its 9 bytes after the end of the gzip stream (at byte " +
          std::to_string(good.size()) +
          ") are not a gzip member (trailing garbage; zlib: incorrect header "
          "check)" +
          kRemedy);
  // The magic, then a damaged member header.
  EXPECT_EQ(
      refusal(good + std::string("\x1f\x8b\x09\0garbage", 11)),
      who +
          ": the gzip stream is corrupt (member 2 of the stream; zlib: "
          "unknown compression method)" +
          kRemedy);
  EXPECT_EQ(
      refusal(good.substr(0, good.size() / 2)),
      who + ": the gzip stream ends early, a truncated file" + kRemedy);
  z = gzip(raw);
  z[20] ^= 0x55;  // inside the deflate data
  EXPECT_NE(
      refusal(z).find(who + ": the gzip stream is corrupt (zlib: "),
      std::string::npos)
      << refusal(z);
}

// A float32 .nii (NIfTI-1) of nx x ny x nz voxels v = i.
std::string nifti_file(int nx, int ny, int nz) {
  nifti_1_header h;
  std::memset(&h, 0, sizeof(h));
  h.sizeof_hdr = 348;
  h.dim[0] = 3;
  h.dim[1] = static_cast<short>(nx);
  h.dim[2] = static_cast<short>(ny);
  h.dim[3] = static_cast<short>(nz);
  for (int i = 4; i < 8; ++i)
    h.dim[i] = 1;
  h.datatype = DT_FLOAT32;
  h.bitpix = 32;
  for (int i = 0; i < 4; ++i)
    h.pixdim[i] = 1;
  h.vox_offset = 352;
  h.xyzt_units = NIFTI_UNITS_MM;
  std::memcpy(h.magic, "n+1\0", 4);
  std::string out(352, '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  for (int i = 0; i < nx * ny * nz; ++i) {
    const float v = static_cast<float>(i);
    out.append(reinterpret_cast<const char*>(&v), 4);
  }
  return out;
}

TEST(GzipFile, NiftiReadersRefuseADamagedStreamThatStillInflates) {
  test::TempDir dir("gz");
  const std::string p = dir.file("img.nii.gz");
  const std::string crc = "convert-nifti: --image '" + p +
                          "': the gzip stream's CRC-32 does not match its "
                          "data" +
                          kRemedy;
  // 40^3 voxels: the header is read without reaching the trailer, and
  // load_data, which reads the voxels in the pass that checks the stream,
  // refuses it; 3^3: zlib's gzread inflates the file whole at the header's
  // read and fails it (read_gzip_file, called there, says why).
  for (const int n : {40, 3}) {
    const std::string raw = nifti_file(n, n, n);
    write_file(p, gzip(raw, 0));
    const NiftiCase c = read_nifti_case("convert-nifti", "--image", p);
    ASSERT_EQ(c.voxels.size(), static_cast<size_t>(n * n * n));
    EXPECT_EQ(c.voxels.back(), static_cast<float>(n * n * n - 1));
    write_file(p, flip_stored(gzip(raw, 0), raw.size() - 3));
    EXPECT_EQ(
        error_of([&] { read_nifti_case("convert-nifti", "--image", p); }), crc)
        << n;
    std::string z = gzip(raw);
    z[z.size() - 1] ^= 1;
    write_file(p, z);
    EXPECT_EQ(
        error_of([&] { read_nifti_case("convert-nifti", "--image", p); }),
        "convert-nifti: --image '" + p +
            "': the gzip stream's length (ISIZE) does not match its data's" +
            kRemedy)
        << n;
    // Two members, split inside the voxels: read as one stream.
    const size_t cut = raw.size() - 50;
    write_file(p, gzip(raw.substr(0, cut)) + gzip(raw.substr(cut)));
    EXPECT_EQ(read_nifti_case("convert-nifti", "--image", p).voxels, c.voxels);
  }
  // A whole gzip stream of a cut file: the voxels it lacks are named.
  const std::string raw = nifti_file(40, 40, 40);
  write_file(p, gzip(raw.substr(0, raw.size() - 10)));
  EXPECT_EQ(
      error_of([&] { read_nifti_case("convert-nifti", "--image", p); }),
      "convert-nifti: --image '" + p + "': its voxel data ends at byte " +
          std::to_string(raw.size() - 10) + " of the " +
          std::to_string(raw.size()) +
          " its header declares (a truncated file?)");
}

}  // namespace
}  // namespace memtrain
