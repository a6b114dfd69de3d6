// memtrain convert-nifti: NIfTI-1 files written by hand (header + data),
// converted, and read back with the HDF5 C API.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <nifti/nifti1.h>
#include <nifti/nifti2.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numeric>

#include "memtrain/convert/nifti_convert.h"
#include "memtrain/formats/nifti/label_map.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

struct Nii {
  std::vector<int> dims;  // nx, ny, nz[, nt]
  int datatype = DT_FLOAT32;
  int bitpix = 32;
  std::array<float, 3> pix{1, 1, 1};
  float slope = 0, inter = 0;
  int sform_code = 0;
  std::array<float, 12> srow{1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0};
  std::vector<char> bytes;
};

template <typename T>
Nii make_nii(std::vector<int> dims, int datatype, const std::vector<T>& v) {
  Nii n;
  n.dims = std::move(dims);
  n.datatype = datatype;
  n.bitpix = static_cast<int>(8 * sizeof(T));
  n.bytes.resize(v.size() * sizeof(T));
  std::memcpy(n.bytes.data(), v.data(), n.bytes.size());
  return n;
}

void write_nii(const std::string& path, const Nii& n) {
  nifti_1_header h;
  std::memset(&h, 0, sizeof(h));
  h.sizeof_hdr = 348;
  h.dim[0] = static_cast<short>(n.dims.size());
  for (size_t i = 0; i < 7; ++i)
    h.dim[i + 1] = i < n.dims.size() ? static_cast<short>(n.dims[i]) : 1;
  h.datatype = static_cast<short>(n.datatype);
  h.bitpix = static_cast<short>(n.bitpix);
  h.pixdim[0] = 1;
  for (int i = 0; i < 3; ++i)
    h.pixdim[i + 1] = n.pix[i];
  h.pixdim[4] = 1;
  h.vox_offset = 352;
  h.scl_slope = n.slope;
  h.scl_inter = n.inter;
  h.xyzt_units = NIFTI_UNITS_MM;
  h.sform_code = static_cast<short>(n.sform_code);
  for (int c = 0; c < 4; ++c) {
    h.srow_x[c] = n.srow[c];
    h.srow_y[c] = n.srow[4 + c];
    h.srow_z[c] = n.srow[8 + c];
  }
  std::memcpy(h.magic, "n+1\0", 4);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));
  const char ext[4] = {0, 0, 0, 0};
  out.write(ext, 4);
  out.write(n.bytes.data(), static_cast<std::streamsize>(n.bytes.size()));
  ASSERT_TRUE(out.good());
}

// The same file as NIfTI-2 (540-byte header, int64 dimensions, float64
// fields).
void write_nii2(const std::string& path, const Nii& n) {
  nifti_2_header h;
  std::memset(&h, 0, sizeof(h));
  h.sizeof_hdr = 540;
  std::memcpy(h.magic, "n+2\0\r\n\032\n", 8);
  h.dim[0] = static_cast<int64_t>(n.dims.size());
  for (size_t i = 0; i < 7; ++i)
    h.dim[i + 1] = i < n.dims.size() ? n.dims[i] : 1;
  h.datatype = static_cast<int16_t>(n.datatype);
  h.bitpix = static_cast<int16_t>(n.bitpix);
  h.pixdim[0] = 1;
  for (int i = 0; i < 3; ++i)
    h.pixdim[i + 1] = n.pix[i];
  h.pixdim[4] = 1;
  h.vox_offset = 544;
  h.scl_slope = n.slope;
  h.scl_inter = n.inter;
  h.xyzt_units = NIFTI_UNITS_MM;
  h.sform_code = n.sform_code;
  for (int c = 0; c < 4; ++c) {
    h.srow_x[c] = n.srow[c];
    h.srow_y[c] = n.srow[4 + c];
    h.srow_z[c] = n.srow[8 + c];
  }
  static_assert(sizeof(h) == 540, "NIfTI-2 header");
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));
  const char ext[4] = {0, 0, 0, 0};
  out.write(ext, 4);
  out.write(n.bytes.data(), static_cast<std::streamsize>(n.bytes.size()));
  ASSERT_TRUE(out.good());
}

// Reads a whole dataset as float64 (HDF5 converts) with its shape.
std::vector<double> read_ds(
    const std::string& path,
    const char* name,
    std::vector<hsize_t>* dims,
    std::string* type = nullptr) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  EXPECT_GE(f, 0) << path;
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  EXPECT_GE(d, 0) << path << " " << name;
  hid_t s = H5Dget_space(d);
  dims->assign(H5Sget_simple_extent_ndims(s), 0);
  H5Sget_simple_extent_dims(s, dims->data(), nullptr);
  size_t n = 1;
  for (auto x : *dims)
    n *= x;
  std::vector<double> v(n);
  H5Dread(d, H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data());
  if (type) {
    hid_t t = H5Dget_type(d);
    *type = H5Tget_class(t) == H5T_FLOAT ? "float" : "int";
    *type += std::to_string(8 * H5Tget_size(t));
    if (H5Tget_class(t) == H5T_INTEGER && H5Tget_sign(t) == H5T_SGN_NONE)
      *type = "u" + *type;
    H5Tclose(t);
  }
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  return v;
}

std::vector<hsize_t> chunk_of(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  hid_t p = H5Dget_create_plist(d);
  std::vector<hsize_t> c(8, 0);
  const int r = H5Pget_chunk(p, 8, c.data());
  c.resize(r > 0 ? r : 0);
  H5Pclose(p);
  H5Dclose(d);
  H5Fclose(f);
  return c;
}

// Numeric attribute(s) of `obj` ("/" or a dataset) as float64.
std::vector<double> attr_num(
    const std::string& path, const char* obj, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t a = H5Aopen_by_name(f, obj, name, H5P_DEFAULT, H5P_DEFAULT);
  EXPECT_GE(a, 0) << path << " " << obj << " " << name;
  hid_t s = H5Aget_space(a);
  const hssize_t n = H5Sget_simple_extent_npoints(s);
  std::vector<double> v(n > 0 ? n : 0);
  H5Aread(a, H5T_NATIVE_DOUBLE, v.data());
  H5Sclose(s);
  H5Aclose(a);
  H5Fclose(f);
  return v;
}

std::string attr_str(const std::string& path, const char* name) {
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (H5Aexists(f, name) <= 0) {
    H5Fclose(f);
    return "<none>";
  }
  hid_t a = H5Aopen(f, name, H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  std::string buf(H5Tget_size(t), '\0');
  H5Aread(a, t, buf.data());
  H5Tclose(t);
  H5Aclose(a);
  H5Fclose(f);
  return buf.substr(0, buf.find('\0'));
}

std::string error_of(const ConvertSpec& spec) {
  try {
    convert_nifti(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The test volume: 6 x 5 x 4 (x, y, z), value i + 10 j + 100 k.
constexpr int NX = 6, NY = 5, NZ = 4;
template <typename T>
std::vector<T> ramp(int nt = 1) {
  std::vector<T> v;
  for (int t = 0; t < nt; ++t)
    for (int k = 0; k < NZ; ++k)
      for (int j = 0; j < NY; ++j)
        for (int i = 0; i < NX; ++i)
          v.push_back(static_cast<T>(i + 10 * j + 100 * k + 1000 * t));
  return v;
}
int label_at(int i, int j, int k) {
  return (i + 2 * j + 3 * k) % 3;
}
std::vector<uint8_t> label_vol() {
  std::vector<uint8_t> v;
  for (int k = 0; k < NZ; ++k)
    for (int j = 0; j < NY; ++j)
      for (int i = 0; i < NX; ++i)
        v.push_back(static_cast<uint8_t>(label_at(i, j, k)));
  return v;
}

class NiftiConvert : public ::testing::Test {
 protected:
  test::TempDir dir{"nifti"};
  std::string img = dir.file("img.nii");
  std::string lbl = dir.file("lbl.nii");
  void SetUp() override {
    Nii l = make_nii({NX, NY, NZ}, DT_UINT8, label_vol());
    l.pix = {1.5f, 2.0f, 2.5f};
    write_nii(lbl, l);
  }
  ConvertSpec spec(const std::string& out = "out.h5") const {
    ConvertSpec s;
    s.image = img;
    s.labels = lbl;
    s.out = dir.file(out);
    return s;
  }
};

TEST_F(NiftiConvert, Int16AxisOrderValuesAndAttributes) {
  Nii n = make_nii({NX, NY, NZ}, DT_INT16, ramp<int16_t>());
  n.pix = {1.5f, 2.0f, 2.5f};
  write_nii(img, n);
  const auto files = convert_nifti(spec());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0].path, dir.file("out.h5"));
  EXPECT_EQ(files[0].shape, (std::vector<int64_t>{1, 1, NZ, NY, NX}));
  EXPECT_EQ(files[0].num_classes, 3);

  std::vector<hsize_t> dims;
  std::string type;
  const auto v = read_ds(dir.file("out.h5"), "volumes", &dims, &type);
  EXPECT_EQ(dims, (std::vector<hsize_t>{1, 1, NZ, NY, NX}));
  EXPECT_EQ(type, "float32");
  // NIfTI (i, j, k) is [0, 0, k, j, i].
  for (int k = 0; k < NZ; ++k)
    for (int j = 0; j < NY; ++j)
      for (int i = 0; i < NX; ++i)
        ASSERT_EQ(v[(k * NY + j) * NX + i], i + 10 * j + 100 * k);
  const auto m = read_ds(dir.file("out.h5"), "masks", &dims, &type);
  EXPECT_EQ(dims, (std::vector<hsize_t>{1, NZ, NY, NX}));
  EXPECT_EQ(type, "uint8");
  std::vector<int64_t> counts(3, 0);
  for (int k = 0; k < NZ; ++k)
    for (int j = 0; j < NY; ++j)
      for (int i = 0; i < NX; ++i) {
        ASSERT_EQ(m[(k * NY + j) * NX + i], label_at(i, j, k));
        ++counts[label_at(i, j, k)];
      }
  EXPECT_EQ(files[0].class_voxels, counts);

  const std::string out = dir.file("out.h5");
  EXPECT_EQ(attr_num(out, "/", "layout_version"), std::vector<double>{1});
  EXPECT_EQ(attr_num(out, "/", "num_classes"), std::vector<double>{3});
  EXPECT_EQ(
      attr_num(out, "/", "spacing_mm"), (std::vector<double>{2.5, 2.0, 1.5}));
  EXPECT_EQ(attr_str(out, "kind"), "volumes");
  EXPECT_NE(attr_str(out, "source").find(img), std::string::npos);
  EXPECT_NE(attr_str(out, "source").find(lbl), std::string::npos);
  EXPECT_EQ(attr_str(out, "class_names"), "<none>");
  // Chunks: min(32, dim).
  EXPECT_EQ(chunk_of(out, "volumes"), (std::vector<hsize_t>{1, 1, NZ, NY, NX}));
  EXPECT_EQ(chunk_of(out, "masks"), (std::vector<hsize_t>{1, NZ, NY, NX}));

  // scale/shift: z-score over the non-zero voxels (all but (0,0,0)).
  double sum = 0, sq = 0;
  int cnt = 0;
  for (double x : v)
    if (x != 0) {
      sum += x;
      sq += x * x;
      ++cnt;
    }
  const double mean = sum / cnt, sd = std::sqrt(sq / cnt - mean * mean);
  EXPECT_NEAR(attr_num(out, "/volumes", "scale")[0], 1 / sd, 1e-9);
  EXPECT_NEAR(attr_num(out, "/volumes", "shift")[0], -mean / sd, 1e-9);
}

TEST_F(NiftiConvert, NiftiTwoConvertsLikeItsNiftiOneTwin) {
  Nii n = make_nii({NX, NY, NZ, 2}, DT_FLOAT32, ramp<float>(2));
  n.pix = {1.5f, 2.0f, 2.5f};
  n.slope = 0.5f;
  n.inter = 3;
  n.sform_code = 1;
  n.srow = {-1.5f, 0, 0, 9, 0, 2, 0, -4, 0, 0, 2.5f, 7};
  write_nii(img, n);
  const std::string img2 = dir.file("img2.nii"), lbl2 = dir.file("lbl2.nii");
  write_nii2(img2, n);
  Nii l = make_nii({NX, NY, NZ}, DT_UINT8, label_vol());
  l.pix = {1.5f, 2.0f, 2.5f};
  write_nii2(lbl2, l);
  convert_nifti(spec("one.h5"));
  auto s2 = spec("two.h5");
  s2.image = img2;
  s2.labels = lbl2;
  convert_nifti(s2);
  for (const char* name : {"volumes", "masks"}) {
    std::vector<hsize_t> d1, d2;
    const auto a = read_ds(dir.file("one.h5"), name, &d1);
    const auto b = read_ds(dir.file("two.h5"), name, &d2);
    EXPECT_EQ(d1, d2) << name;
    EXPECT_EQ(a, b) << name;
  }
  EXPECT_EQ(
      attr_num(dir.file("two.h5"), "/", "spacing_mm"),
      (std::vector<double>{2.5, 2.0, 1.5}));
  for (const char* a : {"scale", "shift"})
    EXPECT_EQ(
        attr_num(dir.file("one.h5"), "/volumes", a),
        attr_num(dir.file("two.h5"), "/volumes", a));
}

TEST_F(NiftiConvert, NonFiniteVoxelsAreRefusedNotZeroed) {
  // libnifti sets NaN/Inf float voxels to 0 as it loads them: the reader
  // looks at the file's bytes first.
  std::vector<float> v = ramp<float>();
  v[(3 * NY + 1) * NX + 2] = std::nanf("");
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, v));
  std::string e = error_of(spec());
  EXPECT_NE(e.find("voxel (2,1,3) is nan"), std::string::npos) << e;
  std::vector<double> w = ramp<double>();
  w[5] = -std::numeric_limits<double>::infinity();
  Nii n = make_nii({NX, NY, NZ}, DT_FLOAT64, w);
  n.bitpix = 64;
  write_nii2(img, n);
  e = error_of(spec());
  EXPECT_NE(e.find("voxel (5,0,0) is -inf"), std::string::npos) << e;
}

TEST_F(NiftiConvert, SmallChunkOption) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_INT16, ramp<int16_t>()));
  auto s = spec();
  s.chunk = 3;
  convert_nifti(s);
  EXPECT_EQ(chunk_of(s.out, "volumes"), (std::vector<hsize_t>{1, 1, 3, 3, 3}));
  EXPECT_EQ(chunk_of(s.out, "masks"), (std::vector<hsize_t>{1, 3, 3, 3}));
}

TEST_F(NiftiConvert, EveryRealDatatypeGivesTheSameValues) {
  auto check = [&](const Nii& n, const char* what) {
    write_nii(img, n);
    convert_nifti(spec());
    std::vector<hsize_t> dims;
    const auto v = read_ds(dir.file("out.h5"), "volumes", &dims);
    const auto want = ramp<double>();
    ASSERT_EQ(v.size(), want.size()) << what;
    for (size_t i = 0; i < v.size(); ++i)
      ASSERT_EQ(v[i], want[i]) << what << " voxel " << i;
  };
  // The ramp reaches 345: uint8 and int8 get their own ramps below.
  check(make_nii({NX, NY, NZ}, DT_INT16, ramp<int16_t>()), "int16");
  check(make_nii({NX, NY, NZ}, DT_UINT16, ramp<uint16_t>()), "uint16");
  check(make_nii({NX, NY, NZ}, DT_INT32, ramp<int32_t>()), "int32");
  check(make_nii({NX, NY, NZ}, DT_UINT32, ramp<uint32_t>()), "uint32");
  check(make_nii({NX, NY, NZ}, DT_INT64, ramp<int64_t>()), "int64");
  check(make_nii({NX, NY, NZ}, DT_UINT64, ramp<uint64_t>()), "uint64");
  check(make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()), "float32");
  check(make_nii({NX, NY, NZ}, DT_FLOAT64, ramp<double>()), "float64");
  std::vector<uint8_t> u8;
  std::vector<int8_t> s8;
  for (int i = 0; i < NX * NY * NZ; ++i) {
    u8.push_back(static_cast<uint8_t>(i * 2));
    s8.push_back(static_cast<int8_t>(i - 60));
  }
  write_nii(img, make_nii({NX, NY, NZ}, DT_UINT8, u8));
  convert_nifti(spec());
  std::vector<hsize_t> dims;
  auto v = read_ds(dir.file("out.h5"), "volumes", &dims);
  for (int i = 0; i < NX * NY * NZ; ++i)
    ASSERT_EQ(v[i], i * 2);
  write_nii(img, make_nii({NX, NY, NZ}, DT_INT8, s8));
  convert_nifti(spec());
  v = read_ds(dir.file("out.h5"), "volumes", &dims);
  for (int i = 0; i < NX * NY * NZ; ++i)
    ASSERT_EQ(v[i], i - 60);
}

TEST_F(NiftiConvert, SlopeAndInterceptAreApplied) {
  std::vector<uint8_t> u8(NX * NY * NZ);
  std::iota(u8.begin(), u8.end(), 0);
  Nii n = make_nii({NX, NY, NZ}, DT_UINT8, u8);
  n.slope = 0.5f;
  n.inter = -3.0f;
  write_nii(img, n);
  convert_nifti(spec());
  std::vector<hsize_t> dims;
  const auto v = read_ds(dir.file("out.h5"), "volumes", &dims);
  for (int i = 0; i < NX * NY * NZ; ++i)
    ASSERT_EQ(v[i], 0.5 * i - 3.0) << i;
  // Slope 0 means "no scaling".
  n.slope = 0;
  n.inter = 7;
  write_nii(img, n);
  convert_nifti(spec());
  const auto w = read_ds(dir.file("out.h5"), "volumes", &dims);
  for (int i = 0; i < NX * NY * NZ; ++i)
    ASSERT_EQ(w[i], i);
}

TEST_F(NiftiConvert, FourDimensionalImageGivesChannels) {
  write_nii(img, make_nii({NX, NY, NZ, 2}, DT_FLOAT64, ramp<double>(2)));
  const auto files = convert_nifti(spec());
  EXPECT_EQ(files[0].shape, (std::vector<int64_t>{1, 2, NZ, NY, NX}));
  std::vector<hsize_t> dims;
  const auto v = read_ds(dir.file("out.h5"), "volumes", &dims);
  EXPECT_EQ(dims, (std::vector<hsize_t>{1, 2, NZ, NY, NX}));
  // [0, c, k, j, i] = i + 10 j + 100 k + 1000 c
  EXPECT_EQ(v[((1 * NZ + 3) * NY + 2) * NX + 5], 5 + 20 + 300 + 1000);
  EXPECT_EQ(v[((0 * NZ + 1) * NY + 4) * NX + 0], 40 + 100);
  EXPECT_EQ(chunk_of(dir.file("out.h5"), "volumes")[1], 2u);
}

TEST_F(NiftiConvert, LabelMapRulesFirstMatchWins) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  // Labels: int16, value = i + 10 j - 5 (so -5..44).
  std::vector<int16_t> raw;
  for (int k = 0; k < NZ; ++k)
    for (int j = 0; j < NY; ++j)
      for (int i = 0; i < NX; ++i)
        raw.push_back(static_cast<int16_t>(i + 10 * j - 5));
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_INT16, raw));
  auto s = spec();
  s.label_map = "3:1, 0-10:2, -5--4:5, >40:3, 41:4";
  const auto files = convert_nifti(s);
  EXPECT_EQ(files[0].num_classes, 6);  // max class 5 + 1
  std::vector<hsize_t> dims;
  const auto m = read_ds(s.out, "masks", &dims);
  for (size_t n = 0; n < raw.size(); ++n) {
    const int v = raw[n];
    int want = 0;
    if (v == 3)
      want = 1;  // before 0-10
    else if (v >= 0 && v <= 10)
      want = 2;
    else if (v == -5 || v == -4)
      want = 5;
    else if (v > 40)
      want = 3;  // 41 never reaches the '41:4' rule
    ASSERT_EQ(m[n], want) << "label " << v;
  }
  EXPECT_EQ(attr_str(s.out, "label_map"), s.label_map);

  // Rules parse as documented.
  const auto rules = parse_label_map(">0:1");
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0].kind, LabelRule::kGreater);
  EXPECT_TRUE(rules[0].matches(0.5));
  EXPECT_FALSE(rules[0].matches(0));
}

TEST_F(NiftiConvert, ClassNamesAndNumClasses) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  auto s = spec();
  s.class_names = "bg,a,b,unused";
  const auto files = convert_nifti(s);
  EXPECT_EQ(files[0].num_classes, 4);
  EXPECT_EQ(files[0].class_voxels.size(), 4u);
  EXPECT_EQ(files[0].class_voxels[3], 0);
  EXPECT_EQ(attr_str(s.out, "class_names"), "bg,a,b,unused");
  EXPECT_EQ(attr_num(s.out, "/", "num_classes"), std::vector<double>{4});
  s.class_names = "bg,a";
  const std::string e = error_of(s);
  EXPECT_NE(e.find("--class-names"), std::string::npos) << e;
  // A single class in the data still gives num_classes 2.
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_UINT8, std::vector<uint8_t>(120)));
  EXPECT_EQ(convert_nifti(spec())[0].num_classes, 2);
}

TEST_F(NiftiConvert, LabelsWithoutMapMustBeSmallNonNegativeIntegers) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  std::vector<float> l(NX * NY * NZ, 1.0f);
  l[(2 * NY + 1) * NX + 3] = -2;  // (3, 1, 2)
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_FLOAT32, l));
  std::string e = error_of(spec());
  EXPECT_NE(e.find(lbl), std::string::npos) << e;
  EXPECT_NE(e.find("(3,1,2)"), std::string::npos) << e;
  EXPECT_NE(e.find("-2"), std::string::npos) << e;
  l[(2 * NY + 1) * NX + 3] = 1.5f;
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_FLOAT32, l));
  e = error_of(spec());
  EXPECT_NE(e.find("1.5"), std::string::npos) << e;
  l[(2 * NY + 1) * NX + 3] = 300;
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_FLOAT32, l));
  e = error_of(spec());
  EXPECT_NE(e.find("300"), std::string::npos) << e;
  EXPECT_NE(e.find("--label-map"), std::string::npos) << e;
  // With a map the same file converts.
  auto s = spec();
  s.label_map = ">=:1";
  EXPECT_NE(error_of(s).find("--label-map"), std::string::npos);
  s.label_map = "1:1,>200:2";
  const auto files = convert_nifti(s);
  EXPECT_EQ(files[0].class_voxels, (std::vector<int64_t>{0, 119, 1}));
}

TEST_F(NiftiConvert, SplitSlabsDoNotOverlapAndConcatenate) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_INT16, ramp<int16_t>()));
  std::vector<hsize_t> dims;
  const auto full_v = ramp<double>();
  for (const char* axis : {"x", "y", "z"}) {
    SCOPED_TRACE(axis);
    auto s = spec("split.h5");
    s.split_axis = axis;
    s.val_fraction = 0.3;
    const auto files = convert_nifti(s);
    ASSERT_EQ(files.size(), 2u);
    EXPECT_EQ(files[0].path, dir.file("split-train.h5"));
    EXPECT_EQ(files[1].path, dir.file("split-val.h5"));
    const int n = axis[0] == 'x' ? NX : axis[0] == 'y' ? NY : NZ;
    const int nval = static_cast<int>(std::lround(0.3 * n));
    const int ntrain = n - nval;
    const int a = axis[0] == 'x' ? 4 : axis[0] == 'y' ? 3 : 2;  // in shape
    EXPECT_EQ(files[0].shape[a], ntrain);
    EXPECT_EQ(files[1].shape[a], nval);
    const auto tv = read_ds(files[0].path, "volumes", &dims);
    const auto vv = read_ds(files[1].path, "volumes", &dims);
    const auto tm = read_ds(files[0].path, "masks", &dims);
    const auto vm = read_ds(files[1].path, "masks", &dims);
    EXPECT_EQ(tv.size() + vv.size(), full_v.size());
    // Reassemble: every voxel of the full volume is in exactly one slab.
    size_t it = 0, iv = 0;
    for (int k = 0; k < NZ; ++k)
      for (int j = 0; j < NY; ++j)
        for (int i = 0; i < NX; ++i) {
          const int c = axis[0] == 'x' ? i : axis[0] == 'y' ? j : k;
          const bool val = c >= ntrain;
          const double v = val ? vv.at(iv) : tv.at(it);
          const double m = val ? vm.at(iv++) : tm.at(it++);
          ASSERT_EQ(v, i + 10 * j + 100 * k);
          ASSERT_EQ(m, label_at(i, j, k));
        }
    EXPECT_EQ(it, tv.size());
    EXPECT_EQ(iv, vv.size());
    EXPECT_EQ(attr_str(files[0].path, "split"), "train");
    EXPECT_EQ(attr_str(files[1].path, "split"), "val");
    // One normalisation for both, from the training slab.
    EXPECT_EQ(
        attr_num(files[0].path, "/volumes", "scale"),
        attr_num(files[1].path, "/volumes", "scale"));
    double sum = 0, sq = 0;
    int cnt = 0;
    for (double x : tv)
      if (x != 0) {
        sum += x;
        sq += x * x;
        ++cnt;
      }
    const double mean = sum / cnt, sd = std::sqrt(sq / cnt - mean * mean);
    EXPECT_NEAR(
        attr_num(files[1].path, "/volumes", "shift")[0], -mean / sd, 1e-9);
  }
}

TEST_F(NiftiConvert, ResampleDimsTrilinearAndNearest) {
  Nii n = make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>());
  write_nii(img, n);
  Nii l = make_nii({NX, NY, NZ}, DT_UINT8, label_vol());
  write_nii(lbl, l);
  auto s = spec();
  s.resample_mm = 2;
  const auto files = convert_nifti(s);
  // round(6/2) = 3, round(5/2) = 3, round(4/2) = 2.
  EXPECT_EQ(files[0].shape, (std::vector<int64_t>{1, 1, 2, 3, 3}));
  EXPECT_EQ(attr_num(s.out, "/", "spacing_mm"), (std::vector<double>{2, 2, 2}));
  std::vector<hsize_t> dims;
  const auto v = read_ds(s.out, "volumes", &dims);
  const auto m = read_ds(s.out, "masks", &dims);
  // Output o sits at input x = (n-1)/2 + (o - (m-1)/2) * 2, clamped:
  // x: 0.5, 2.5, 4.5; y: 0, 2, 4; z: 0.5, 2.5. The ramp is linear, so
  // trilinear interpolation reproduces it exactly.
  const double xs[3] = {0.5, 2.5, 4.5}, ys[3] = {0, 2, 4}, zs[2] = {0.5, 2.5};
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 3; ++i) {
        const size_t o = (k * 3 + j) * 3 + i;
        EXPECT_NEAR(v[o], xs[i] + 10 * ys[j] + 100 * zs[k], 1e-4);
        // Nearest: ties go up (x 0.5 -> 1).
        const int ni = static_cast<int>(std::floor(xs[i] + 0.5));
        const int nj = static_cast<int>(ys[j]);
        const int nk = static_cast<int>(std::floor(zs[k] + 0.5));
        EXPECT_EQ(m[o], label_at(ni, nj, nk)) << i << j << k;
      }
  EXPECT_EQ(m[0], label_at(1, 0, 1));

  // Anisotropic input, upsampled: 2 mm x voxels -> 1 mm doubles nx.
  n.pix = {2, 1, 1};
  l.pix = {2, 1, 1};
  write_nii(img, n);
  write_nii(lbl, l);
  s.resample_mm = 1;
  const auto up = convert_nifti(s);
  EXPECT_EQ(up[0].shape, (std::vector<int64_t>{1, 1, NZ, NY, 2 * NX}));
  const auto u = read_ds(s.out, "volumes", &dims);
  // Output x o at input 2.5 + (o - 5.5) / 2: o = 3 -> 1.25.
  EXPECT_NEAR(u[3], 1.25, 1e-5);
  EXPECT_NEAR(u[0], 0.0, 1e-5);  // clamped at the border
  EXPECT_NEAR(u[11], 5.0, 1e-5);
}

TEST_F(NiftiConvert, UnsupportedDatatypesNameFileAndType) {
  std::vector<float> c64(2 * NX * NY * NZ, 1.0f);
  Nii n = make_nii({NX, NY, NZ}, DT_COMPLEX64, c64);
  n.bitpix = 64;
  write_nii(img, n);
  std::string e = error_of(spec());
  EXPECT_NE(e.find(img), std::string::npos) << e;
  EXPECT_NE(e.find("datatype complex64 (code 32)"), std::string::npos) << e;
  EXPECT_NE(e.find("float32"), std::string::npos) << e;  // what is supported

  std::vector<uint8_t> rgb(3 * NX * NY * NZ, 7);
  n = make_nii({NX, NY, NZ}, DT_RGB24, rgb);
  n.bitpix = 24;
  write_nii(lbl, n);
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  e = error_of(spec());
  EXPECT_NE(e.find(lbl), std::string::npos) << e;
  EXPECT_NE(e.find("datatype rgb24 (code 128)"), std::string::npos) << e;
}

TEST_F(NiftiConvert, GridMismatchNamesBothFiles) {
  write_nii(img, make_nii({NX, NY, NZ + 1}, DT_FLOAT32, ramp<float>(2)));
  std::string e = error_of(spec());
  EXPECT_NE(e.find(img), std::string::npos) << e;
  EXPECT_NE(e.find(lbl), std::string::npos) << e;
  EXPECT_NE(e.find("6x5x5"), std::string::npos) << e;
  EXPECT_NE(e.find("6x5x4"), std::string::npos) << e;
  // 4D labels are refused.
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  write_nii(lbl, make_nii({NX, NY, NZ, 2}, DT_FLOAT32, ramp<float>(2)));
  e = error_of(spec());
  EXPECT_NE(e.find(lbl), std::string::npos) << e;
  EXPECT_NE(e.find("3D"), std::string::npos) << e;
}

TEST_F(NiftiConvert, DifferentWorldTransformsAreRefused) {
  Nii n = make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>());
  n.sform_code = 4;
  write_nii(img, n);
  Nii l = make_nii({NX, NY, NZ}, DT_UINT8, label_vol());
  l.sform_code = 4;
  l.srow[0] = -1;  // x flipped
  l.srow[3] = 5;
  write_nii(lbl, l);
  auto s = spec();
  const std::string e = error_of(s);
  EXPECT_NE(e.find("voxel-to-world"), std::string::npos) << e;
  EXPECT_NE(e.find("--ignore-affine"), std::string::npos) << e;
  s.check_affine = false;
  EXPECT_EQ(convert_nifti(s).size(), 1u);
  // The same transform in both: fine.
  l.srow[0] = 1;
  l.srow[3] = 0;
  write_nii(lbl, l);
  EXPECT_EQ(convert_nifti(spec()).size(), 1u);
}

TEST_F(NiftiConvert, BadFilesAndFlags) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  auto s = spec();
  s.image = dir.file("missing.nii.gz");
  std::string e = error_of(s);
  EXPECT_NE(e.find("missing.nii.gz"), std::string::npos) << e;
  EXPECT_NE(e.find("no such file"), std::string::npos) << e;

  {
    std::ofstream t(dir.file("text.nii"));
    t << "this is not a NIfTI file\n";
  }
  s = spec();
  s.labels = dir.file("text.nii");
  e = error_of(s);
  EXPECT_NE(e.find("text.nii"), std::string::npos) << e;
  EXPECT_NE(e.find("not a NIfTI file"), std::string::npos) << e;

  s = spec();
  s.label_map = "1:1,banana";
  e = error_of(s);
  EXPECT_NE(e.find("--label-map"), std::string::npos) << e;
  EXPECT_NE(e.find("banana"), std::string::npos) << e;
  for (const char* bad : {"1:300", "5-2:1", ":1", "1:", ">x:1", "1:1.5"}) {
    s.label_map = bad;
    EXPECT_NE(error_of(s).find("--label-map"), std::string::npos) << bad;
  }

  s = spec();
  s.split_axis = "t";
  e = error_of(s);
  EXPECT_NE(e.find("--split-axis 't'"), std::string::npos) << e;
  s.split_axis = "z";
  for (double f : {0.0, 1.0, -0.5, 1.5}) {
    s.val_fraction = f;
    e = error_of(s);
    EXPECT_NE(e.find("--val-fraction"), std::string::npos) << f << ": " << e;
  }
  s.val_fraction = 0.1;  // round(0.4) = 0 planes of 4
  e = error_of(s);
  EXPECT_NE(e.find("--val-fraction"), std::string::npos) << e;
  EXPECT_NE(e.find("0 validation planes"), std::string::npos) << e;
  s.val_fraction = 0.9;  // round(3.6) = 4: no training plane
  e = error_of(s);
  EXPECT_NE(e.find("0 training"), std::string::npos) << e;

  s = spec();
  s.resample_mm = -1;
  EXPECT_NE(error_of(s).find("--resample"), std::string::npos);
  s = spec();
  s.chunk = 0;
  EXPECT_NE(error_of(s).find("--chunk"), std::string::npos);
}

TEST_F(NiftiConvert, FailureLeavesExistingOutputAndNoTemporaries) {
  write_nii(img, make_nii({NX, NY, NZ}, DT_FLOAT32, ramp<float>()));
  const std::string out = dir.file("out.h5");
  {
    std::ofstream o(out);
    o << "old";
  }
  std::vector<int16_t> neg(NX * NY * NZ, -1);
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_INT16, neg));
  EXPECT_NE(error_of(spec()), "");
  std::ifstream in(out);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "old");

  // A folder that does not exist: the error names it, nothing is left.
  write_nii(lbl, make_nii({NX, NY, NZ}, DT_UINT8, label_vol()));
  auto s = spec();
  s.out = dir.file("nope/out.h5");
  EXPECT_NE(error_of(s).find("nope/out.h5.tmp"), std::string::npos);
  // Success replaces the old file; no temporary remains.
  convert_nifti(spec());
  std::vector<hsize_t> dims;
  EXPECT_EQ(read_ds(out, "volumes", &dims).size(), size_t{NX * NY * NZ});
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

}  // namespace
}  // namespace memtrain
