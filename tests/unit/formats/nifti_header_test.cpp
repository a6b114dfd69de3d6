// NIfTI headers checked before libnifti reads them (issue 35, point 1):
// valid files byte-patched into damaged ones (NIfTI-1 and NIfTI-2, .nii
// and .nii.gz, either byte order), each refused naming the file, the
// field and its value, with nothing written; Analyze 7.5 pairs accepted
// only with --analyze-orientation, whose transform is then compared with
// the labels'; resampling grids that do not fit in memory refused up
// front.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nifti2_io.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <type_traits>

#include "memtrain/convert/nifti_convert.h"
#include "memtrain/formats/nifti/nifti_volume.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

constexpr int NX = 4, NY = 3, NZ = 2;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A valid file's bytes: header (NIfTI-1 348 + 4 extension bytes, or
// NIfTI-2 540 + 4), then the voxels: float32 image i + 10 j + 100 k, or
// uint8 labels (i + j + k) % 2.
std::vector<char> valid_file(bool labels, int version = 1) {
  std::vector<char> data;
  for (int k = 0; k < NZ; ++k)
    for (int j = 0; j < NY; ++j)
      for (int i = 0; i < NX; ++i) {
        if (labels) {
          data.push_back(static_cast<char>((i + j + k) % 2));
        } else {
          const float v = static_cast<float>(i + 10 * j + 100 * k);
          const char* p = reinterpret_cast<const char*>(&v);
          data.insert(data.end(), p, p + 4);
        }
      }
  const int dt = labels ? DT_UINT8 : DT_FLOAT32;
  const int bitpix = labels ? 8 : 32;
  std::vector<char> out;
  // The fields both versions share, on either header struct.
  auto fill = [&](auto& h, size_t bytes, size_t offset) {
    using H = std::remove_reference_t<decltype(h)>;
    std::memset(&h, 0, sizeof(H));
    h.sizeof_hdr = static_cast<decltype(h.sizeof_hdr)>(bytes);
    h.dim[0] = 3;
    h.dim[1] = NX;
    h.dim[2] = NY;
    h.dim[3] = NZ;
    for (int i = 4; i < 8; ++i)
      h.dim[i] = 1;
    h.datatype = static_cast<decltype(h.datatype)>(dt);
    h.bitpix = static_cast<decltype(h.bitpix)>(bitpix);
    h.pixdim[0] = 1;
    h.pixdim[1] = 2;
    h.pixdim[2] = 3;
    h.pixdim[3] = 4;
    h.vox_offset = static_cast<decltype(h.vox_offset)>(offset);
    h.xyzt_units = NIFTI_UNITS_MM;
  };
  if (version == 1) {
    nifti_1_header h;
    fill(h, 348, 352);
    std::memcpy(h.magic, "n+1\0", 4);
    out.resize(352);
    std::memcpy(out.data(), &h, 348);
  } else {
    nifti_2_header h;
    fill(h, 540, 544);
    std::memcpy(h.magic, "n+2\0\r\n\032\n", 8);
    out.resize(544);
    std::memcpy(out.data(), &h, 540);
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <typename T>
void put(std::vector<char>* b, size_t offset, T v) {
  std::memcpy(b->data() + offset, &v, sizeof(T));
}

void write_bytes(const std::string& path, const std::vector<char>& b) {
  if (path.size() > 3 && path.substr(path.size() - 3) == ".gz") {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(
        gzwrite(f, b.data(), static_cast<unsigned>(b.size())),
        static_cast<int>(b.size()));
    gzclose(f);
    return;
  }
  std::ofstream out(path, std::ios::binary);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
  ASSERT_TRUE(out.good());
}

// One damage: a field of the NIfTI-1 header set to a value, and what the
// refusal must say.
struct Damage {
  const char* what;  // the message's "field = value"
  std::function<void(std::vector<char>*)> patch;
};

std::vector<Damage> nifti1_damages() {
  return {
      {"no NIfTI magic", [](auto* b) { put<uint32_t>(b, 344, 0); }},
      {"magic 'ni1' marks a .hdr/.img pair's header",
       [](auto* b) { std::memcpy(b->data() + 344, "ni1", 4); }},
      {"sizeof_hdr = 0", [](auto* b) { put<int32_t>(b, 0, 0); }},
      {"pixdim[3] = 0", [](auto* b) { put<float>(b, 88, 0.0f); }},
      {"pixdim[3] = nan", [](auto* b) { put<float>(b, 88, NAN); }},
      {"pixdim[3] = inf", [](auto* b) { put<float>(b, 88, INFINITY); }},
      {"pixdim[1] = -2", [](auto* b) { put<float>(b, 80, -2.0f); }},
      {"vox_offset = -100", [](auto* b) { put<float>(b, 108, -100.0f); }},
      {"vox_offset = nan", [](auto* b) { put<float>(b, 108, NAN); }},
      {"vox_offset = 10", [](auto* b) { put<float>(b, 108, 10.0f); }},
      {"dim[0] = 0", [](auto* b) { put<int16_t>(b, 40, 0); }},
      {"dim[2] = 0", [](auto* b) { put<int16_t>(b, 44, 0); }},
      {"dim[1] = -4", [](auto* b) { put<int16_t>(b, 42, -4); }},
      {"datatype binary (code 1) is not supported; supported: real scalars",
       [](auto* b) {
         put<int16_t>(b, 70, 1);
         put<int16_t>(b, 72, 1);
       }},
      {"datatype code 999 (not a NIfTI datatype) is not supported",
       [](auto* b) { put<int16_t>(b, 70, 999); }},
      {"sform_code = 9", [](auto* b) { put<int16_t>(b, 254, 9); }},
      {"qform_code = -1", [](auto* b) { put<int16_t>(b, 252, -1); }},
      {"is singular (determinant 0)",
       [](auto* b) {
         put<int16_t>(b, 254, 1);
         put<float>(b, 280, 2.0f);  // srow_x = 2 0 0 0, srow_y = 0, srow_z
         put<float>(b, 312 + 8, 4.0f);
       }},
      {"srow_y[3] = nan with sform_code = 2",
       [](auto* b) {
         put<int16_t>(b, 254, 2);
         put<float>(b, 280, 2.0f);
         put<float>(b, 296 + 4, 3.0f);
         put<float>(b, 296 + 12, NAN);
         put<float>(b, 312 + 8, 4.0f);
       }},
      {"quatern_b^2 + quatern_c^2 + quatern_d^2 = 1.62",
       [](auto* b) {
         put<int16_t>(b, 252, 1);
         put<float>(b, 256, 0.9f);
         put<float>(b, 260, 0.9f);
       }},
      {"pixdim[0] (qfac) = -0.5 with qform_code = 1",
       [](auto* b) {
         put<int16_t>(b, 252, 1);
         put<float>(b, 76, -0.5f);
       }},
      {"scl_inter = nan with scl_slope = 2",
       [](auto* b) {
         put<float>(b, 112, 2.0f);
         put<float>(b, 116, NAN);
       }},
  };
}

class NiftiHeader : public ::testing::Test {
 protected:
  test::TempDir dir{"nifti-header"};
  ConvertSpec spec(const std::string& img, const std::string& lbl) const {
    ConvertSpec s;
    s.image = img;
    s.labels = lbl;
    s.out = dir.file("out.h5");
    return s;
  }
  // The refusal of converting `img` with `lbl`; checks nothing was
  // written.
  std::string refusal(const ConvertSpec& s) const {
    const std::string e = test::error_of([&] { convert_nifti(s); });
    EXPECT_FALSE(std::filesystem::exists(s.out)) << e;
    for (const auto& f : std::filesystem::directory_iterator(dir.path()))
      EXPECT_EQ(f.path().string().find(".tmp."), std::string::npos) << f.path();
    return e;
  }
  std::vector<double> volumes(const std::string& path) const {
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
    EXPECT_GE(f, 0) << path;
    hid_t d = H5Dopen2(f, "volumes", H5P_DEFAULT);
    std::vector<double> v(NX * NY * NZ);
    EXPECT_GE(
        H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()),
        0);
    H5Dclose(d);
    H5Fclose(f);
    return v;
  }
};

TEST_F(NiftiHeader, ValidFilesConvertEveryDamageIsRefusedNamingTheField) {
  for (const char* ext : {".nii", ".nii.gz"}) {
    const std::string img = dir.file(std::string("img") + ext);
    const std::string lbl = dir.file(std::string("lbl") + ext);
    write_bytes(img, valid_file(false));
    write_bytes(lbl, valid_file(true));
    const auto files = convert_nifti(spec(img, lbl));
    ASSERT_EQ(files.size(), 1u);
    EXPECT_EQ(files[0].spacing_mm, (std::array<double, 3>{4, 3, 2}));
    const std::vector<double> good = volumes(dir.file("out.h5"));
    std::filesystem::remove(dir.file("out.h5"));
    for (const Damage& d : nifti1_damages()) {
      std::vector<char> b = valid_file(false);
      d.patch(&b);
      write_bytes(img, b);
      const std::string e = refusal(spec(img, lbl));
      EXPECT_NE(e.find("convert-nifti: --image '" + img + "': "), e.npos)
          << d.what << ": " << e;
      EXPECT_NE(e.find(d.what), e.npos) << ext << ": " << e;
      // The same damage in the labels only.
      write_bytes(img, valid_file(false));
      b = valid_file(true);
      d.patch(&b);
      write_bytes(lbl, b);
      const std::string el = refusal(spec(img, lbl));
      EXPECT_NE(el.find("--labels '" + lbl + "': "), el.npos) << el;
      write_bytes(lbl, valid_file(true));
    }
    // Repaired, it converts to the same data again.
    convert_nifti(spec(img, lbl));
    EXPECT_EQ(volumes(dir.file("out.h5")), good);
    std::filesystem::remove(dir.file("out.h5"));
  }
}

TEST_F(NiftiHeader, MessagesSayWhatAValidFileHas) {
  const std::string img = dir.file("img.nii"), lbl = dir.file("lbl.nii");
  write_bytes(lbl, valid_file(true));
  std::vector<char> b = valid_file(false);
  put<float>(&b, 88, 0.0f);
  write_bytes(img, b);
  EXPECT_EQ(
      refusal(spec(img, lbl)),
      "convert-nifti: --image '" + img +
          "': pixdim[3] = 0; the voxel size of a spatial axis must be finite "
          "and > 0 (fix the header, e.g. with nibabel's header.set_zooms)");
  b = valid_file(false);
  put<float>(&b, 108, 10.0f);
  write_bytes(img, b);
  EXPECT_NE(
      refusal(spec(img, lbl))
          .find("vox_offset = 10; the voxels of a single-file NIfTI-1 (or "
                "Analyze) start at byte 352 or later"),
      std::string::npos);
  b = valid_file(false);
  put<int16_t>(&b, 70, 1);
  write_bytes(img, b);
  EXPECT_NE(
      refusal(spec(img, lbl))
          .find("datatype binary (code 1) is not supported; supported: real "
                "scalars (uint8, int8, int16, uint16, int32, uint32, int64, "
                "uint64, float32, float64)"),
      std::string::npos);
  // A directory in place of a file.
  std::filesystem::create_directory(dir.file("d.nii"));
  EXPECT_EQ(
      refusal(spec(dir.file("d.nii"), lbl)),
      "convert-nifti: --image '" + dir.file("d.nii") +
          "': is a directory, not a file");
}

TEST_F(NiftiHeader, NiftiTwoDamagesAreRefused) {
  for (const char* ext : {".nii", ".nii.gz"}) {
    const std::string img = dir.file(std::string("img2") + ext);
    const std::string lbl = dir.file(std::string("lbl2") + ext);
    write_bytes(img, valid_file(false, 2));
    write_bytes(lbl, valid_file(true, 2));
    convert_nifti(spec(img, lbl));
    const std::vector<double> good = volumes(dir.file("out.h5"));
    std::filesystem::remove(dir.file("out.h5"));
    const std::vector<
        std::pair<const char*, std::function<void(std::vector<char>*)>>>
        damages = {
            {"magic 'n+3\\x00' (bytes 4-7 of a 540-byte NIfTI-2 header)",
             [](auto* b) { (*b)[6] = '3'; }},
            {"dim[0] = 0", [](auto* b) { put<int64_t>(b, 16, 0); }},
            {"dim[3] = -2", [](auto* b) { put<int64_t>(b, 40, -2); }},
            {"pixdim[3] = 0", [](auto* b) { put<double>(b, 128, 0.0); }},
            {"pixdim[2] = nan", [](auto* b) { put<double>(b, 120, kNaN); }},
            {"pixdim[1] = inf", [](auto* b) { put<double>(b, 112, kInf); }},
            {"vox_offset = 100", [](auto* b) { put<int64_t>(b, 168, 100); }},
            {"datatype binary (code 1)",
             [](auto* b) { put<int16_t>(b, 12, 1); }},
            {"sform_code = 9", [](auto* b) { put<int32_t>(b, 348, 9); }},
            {"is singular", [](auto* b) { put<int32_t>(b, 348, 1); }},
        };
    for (const auto& [what, patch] : damages) {
      std::vector<char> b = valid_file(false, 2);
      patch(&b);
      write_bytes(img, b);
      const std::string e = refusal(spec(img, lbl));
      EXPECT_NE(e.find("--image '" + img + "': "), e.npos) << e;
      EXPECT_NE(e.find(what), e.npos) << ext << ": " << e;
    }
    write_bytes(img, valid_file(false, 2));
    convert_nifti(spec(img, lbl));
    EXPECT_EQ(volumes(dir.file("out.h5")), good);
    std::filesystem::remove(dir.file("out.h5"));
  }
}

TEST_F(NiftiHeader, BigEndianFilesAreCheckedToo) {
  const std::string img = dir.file("be.nii"), lbl = dir.file("lbl.nii");
  write_bytes(lbl, valid_file(true));
  std::vector<char> b = valid_file(false);
  nifti_1_header h;
  std::memcpy(&h, b.data(), 348);
  nifti_swap_as_nifti1(&h);
  std::memcpy(b.data(), &h, 348);
  for (size_t o = 352; o + 4 <= b.size(); o += 4)
    std::reverse(b.begin() + o, b.begin() + o + 4);
  write_bytes(img, b);
  convert_nifti(spec(img, lbl));
  const std::vector<double> v = volumes(dir.file("out.h5"));
  EXPECT_EQ(v[1], 1);
  EXPECT_EQ(v[NX], 10);
  EXPECT_EQ(v[NX * NY], 100);
  std::filesystem::remove(dir.file("out.h5"));
  h.pixdim[3] = 0;  // 0 in either byte order
  std::memcpy(b.data(), &h, 348);
  write_bytes(img, b);
  EXPECT_NE(refusal(spec(img, lbl)).find("pixdim[3] = 0"), std::string::npos);
}

// An Analyze 7.5 pair (.hdr without the NIfTI magic, .img of voxels).
void write_analyze(const std::string& stem, bool labels) {
  std::vector<char> b = valid_file(labels);
  put<uint32_t>(&b, 344, 0);
  put<float>(&b, 108, 0.0f);  // vox_offset: the .img starts with voxels
  write_bytes(stem + ".hdr", std::vector<char>(b.begin(), b.begin() + 348));
  write_bytes(stem + ".img", std::vector<char>(b.begin() + 352, b.end()));
}

TEST_F(NiftiHeader, AnalyzeNeedsAnExplicitOrientation) {
  const std::string img = dir.file("an"), lbl = dir.file("lbl");
  write_analyze(img, false);
  write_analyze(lbl, true);
  auto s = spec(img + ".hdr", lbl + ".img");
  std::string e = refusal(s);
  EXPECT_NE(
      e.find("convert-nifti: --image '" + img + ".hdr': no NIfTI magic"),
      e.npos)
      << e;
  EXPECT_NE(e.find("--analyze-orientation"), e.npos) << e;
  for (const char* bad : {"LRS", "las", "LA", "LASR", "XYZ", "LAA"}) {
    s.analyze_orientation = bad;
    e = refusal(s);
    EXPECT_NE(
        e.find(
            std::string("--analyze-orientation '") + bad +
            "' is not an axis code"),
        e.npos)
        << e;
  }
  s.analyze_orientation = "LAS";
  convert_nifti(s);
  const std::vector<double> analyze = volumes(s.out);
  std::filesystem::remove(s.out);
  // The same voxels as the NIfTI twin.
  write_bytes(dir.file("twin.nii"), valid_file(false));
  write_bytes(dir.file("twinl.nii"), valid_file(true));
  convert_nifti(spec(dir.file("twin.nii"), dir.file("twinl.nii")));
  EXPECT_EQ(analyze, volumes(s.out));
  std::filesystem::remove(s.out);
  // The option with NIfTI files only: refused, it would change nothing.
  auto t = spec(dir.file("twin.nii"), dir.file("twinl.nii"));
  t.analyze_orientation = "RAS";
  e = refusal(t);
  EXPECT_NE(e.find("neither"), e.npos) << e;
  EXPECT_NE(e.find("drop the option"), e.npos) << e;
}

// A NIfTI twin of the Analyze image whose sform is `affine`.
void write_twin_labels(const std::string& path, const Affine& a) {
  std::vector<char> b = valid_file(true);
  put<int16_t>(&b, 254, 2);
  for (int e = 0; e < 12; ++e)
    put<float>(&b, 280 + 4 * e, static_cast<float>(a[e]));
  write_bytes(path, b);
}

TEST_F(NiftiHeader, AnalyzeOrientationIsComparedWithTheLabels) {
  // nibabel's AnalyzeImage of this header (zooms 2, 3, 4; shape 4, 3, 2):
  // [[-2, 0, 0, 3], [0, 3, 0, -3], [0, 0, 4, -2]] = LAS, centred.
  const Affine las = {-2, 0, 0, 3, 0, 3, 0, -3, 0, 0, 4, -2, 0, 0, 0, 1};
  const std::string img = dir.file("an");
  write_analyze(img, false);
  write_twin_labels(dir.file("lbl.nii"), las);
  auto s = spec(img + ".img", dir.file("lbl.nii"));
  s.analyze_orientation = "LAS";
  EXPECT_EQ(convert_nifti(s).size(), 1u);
  std::filesystem::remove(s.out);
  // RAS: x runs the other way; the labels' sform says LAS: refused.
  s.analyze_orientation = "RAS";
  std::string e = refusal(s);
  EXPECT_NE(e.find("different voxel-to-world transforms"), e.npos) << e;
  EXPECT_NE(e.find("image [2 0 0 -3; 0 3 0 -3; 0 0 4 -2]"), e.npos) << e;
  // Permuted axes: i toward S, j toward A, k toward L.
  const Affine sal = {0, 0, -4, 2, 0, 3, 0, -3, 2, 0, 0, -3, 0, 0, 0, 1};
  write_twin_labels(dir.file("lbl.nii"), sal);
  s.analyze_orientation = "SAL";
  EXPECT_EQ(convert_nifti(s).size(), 1u);
}

TEST_F(NiftiHeader, ResampleGridBeyondMemoryIsRefusedUpFront) {
  const std::string img = dir.file("img.nii"), lbl = dir.file("lbl.nii");
  write_bytes(img, valid_file(false));
  write_bytes(lbl, valid_file(true));
  auto s = spec(img, lbl);
  s.resample_mm = 1e-6;
  const std::string e = refusal(s);
  EXPECT_NE(
      e.find("convert-nifti: --resample 1e-06 makes a 8000000x9000000x8000000 "
             "grid"),
      e.npos)
      << e;
  EXPECT_NE(
      e.find("GiB available (MemAvailable); use a larger --resample"), e.npos)
      << e;
  for (double bad : {-1.0, kNaN, kInf}) {
    s.resample_mm = bad;
    EXPECT_NE(
        refusal(s).find("must be a positive voxel size"), std::string::npos);
  }
  s.resample_mm = 1;  // 8 x 9 x 8: fine
  EXPECT_EQ(convert_nifti(s)[0].shape, (std::vector<int64_t>{1, 1, 8, 9, 8}));
}

TEST_F(NiftiHeader, ResampledDimsWithinMemory) {
  EXPECT_EQ(
      resampled_dims_within_memory(
          "x", "y", {10, 20, 30}, {1, 1, 1}, {2, 2, 2}, 1, "z"),
      (std::array<int64_t, 3>{5, 10, 15}));
  const std::string e = test::error_of([] {
    resampled_dims_within_memory(
        "cmd",
        "what",
        {512, 512, 512},
        {1, 1, 1},
        {0.001, 0.001, 0.001},
        2,
        "the remedy");
  });
  EXPECT_NE(
      e.find("cmd: what makes a 512000x512000x512000 grid (x, y, z: "), e.npos)
      << e;
  EXPECT_NE(e.find("as float32 x 2 channels + labels"), e.npos) << e;
  EXPECT_NE(e.find("; the remedy"), e.npos) << e;
}

TEST_F(NiftiHeader, PredictReadsAndWritesAnAnalyzeCaseWithItsOrientation) {
  // A .nii without the magic (predict reads .nii and .nii.gz only).
  std::vector<char> b = valid_file(false);
  put<uint32_t>(&b, 344, 0);
  const std::string in = dir.file("case.nii");
  write_bytes(in, b);
  EXPECT_NE(
      test::error_of([&] {
        read_nifti_case("predict", "--input", in);
      }).find("predict: --input '" + in + "': no NIfTI magic"),
      std::string::npos);
  write_bytes(dir.file("nifti.nii"), valid_file(false));
  EXPECT_EQ(
      check_nifti_headers(
          "predict", "--input", {in, dir.file("nifti.nii")}, "LAS"),
      1);
  EXPECT_NE(
      test::error_of([&] {
        check_nifti_headers("predict", "--input", {in}, "");
      }).find("no NIfTI magic"),
      std::string::npos);
  const NiftiCase c = read_nifti_case("predict", "--input", in, "RAS");
  const Affine ras = {2, 0, 0, -3, 0, 3, 0, -3, 0, 0, 4, -2, 0, 0, 0, 1};
  EXPECT_EQ(c.affine, ras);
  EXPECT_EQ(c.voxels[1], 1);
  EXPECT_EQ(c.voxels[NX * NY], 100);
  // The label map carries that transform as its sform (code 2).
  const std::string out = dir.file("out.nii.gz");
  write_nifti_labels_like(
      in, std::vector<uint8_t>(NX * NY * NZ, 1), out, "RAS");
  nifti_image* im = nifti_image_read(out.c_str(), 1);
  ASSERT_NE(im, nullptr);
  EXPECT_EQ(im->sform_code, NIFTI_XFORM_ALIGNED_ANAT);
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(im->sto_xyz.m[r][k], ras[r * 4 + k], 1e-6) << r << k;
  EXPECT_EQ(static_cast<const uint8_t*>(im->data)[5], 1);
  nifti_image_free(im);
}

}  // namespace
}  // namespace memtrain
