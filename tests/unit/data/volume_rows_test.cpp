// Rows that belong to volumes (docs/data-format.md): make-data --kind
// patch-features, the checks of /volume_ids and /voxel_index on open (each
// bad case and its message), the grouping by volume, inspect's line and
// the prediction dump's file.

#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/h5/volume_rows.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "test_support.h"

namespace memtrain {
namespace {

SyntheticSpec patch_spec(int64_t volumes, int64_t grid) {
  SyntheticSpec spec;
  spec.kind = "patch-features";
  spec.volumes = volumes;
  spec.grid = grid;
  spec.features = 6;
  spec.context = 4;
  spec.classes = 2;
  spec.seed = 7;
  return spec;
}

std::vector<int64_t> flat_voxels(const DatasetInfo& info) {
  std::vector<int64_t> out;
  for (const auto& v : info.row_voxel_index)
    out.insert(out.end(), v.begin(), v.end());
  return out;
}

TEST(VolumeRows, PatchFeaturesHaveEveryPositionOfEveryVolume) {
  test::TempDir dir("vrows");
  const SyntheticSpec spec = patch_spec(3, 5);
  make_synthetic(spec, dir.file("a.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("a.h5"), "data.train");
  const DatasetInfo& info = ds.info();
  ASSERT_TRUE(info.has_volume_rows);
  ASSERT_EQ(info.num_samples, 3 * 125);
  EXPECT_EQ(info.sample_shape, std::vector<int64_t>{6});
  EXPECT_EQ(info.context_features, 4);
  EXPECT_TRUE(info.checksummed) << "make-data checksums every dataset";
  const VolumeRowIndex index = index_volume_rows(info);
  EXPECT_EQ(index.ids, (std::vector<int64_t>{0, 1, 2}));
  for (int64_t v = 0; v < 3; ++v) {
    EXPECT_EQ(index.extent[v], (std::array<int64_t, 3>{5, 5, 5}));
    ASSERT_EQ(index.rows[v].size(), 125u);
    // Volume by volume, in raster order; a blob and a background in each.
    std::set<int64_t> offsets, classes;
    for (size_t k = 0; k < 125; ++k) {
      const int64_t r = index.rows[v][k];
      EXPECT_EQ(r, v * 125 + int64_t(k));
      offsets.insert(index.grid_offset(v, info.row_voxel_index[r]));
      classes.insert(info.row_labels[r]);
    }
    EXPECT_EQ(offsets.size(), 125u);
    EXPECT_EQ(*offsets.rbegin(), 124);
    EXPECT_EQ(classes, (std::set<int64_t>{0, 1})) << "volume " << v;
  }
  EXPECT_EQ(
      describe_volume_rows(index), "3 volume(s) (ids 0..2), grid(s) 5x5x5 (3)");
  const InspectReport report = inspect_file(dir.file("a.h5"));
  EXPECT_TRUE(report.ok) << report.text;
  EXPECT_NE(
      report.text.find(
          "volume rows: 3 volume(s) (ids 0..2), grid(s) 5x5x5 (3)"),
      std::string::npos)
      << report.text;
}

TEST(VolumeRows, PatchFeaturesAreDeterministicAndShuffleOnlyReorders) {
  test::TempDir dir("vrows");
  SyntheticSpec spec = patch_spec(2, 4);
  make_synthetic(spec, dir.file("a.h5"));
  make_synthetic(spec, dir.file("b.h5"));
  spec.shuffle = true;
  make_synthetic(spec, dir.file("s.h5"));
  spec.shuffle = false;
  spec.split = "val";
  make_synthetic(spec, dir.file("v.h5"));
  auto rows = [](const std::string& p) {
    const H5Dataset ds = H5Dataset::open(p, "t");
    const DatasetInfo& info = ds.info();
    std::vector<int64_t> idx(info.num_samples);
    for (int64_t i = 0; i < info.num_samples; ++i)
      idx[i] = i;
    std::vector<float> x(idx.size() * 6), c(idx.size() * 4);
    std::vector<int64_t> y(idx.size());
    ds.read(idx, x.data(), y.data(), c.data());
    // (volume, voxel) -> label, features, context
    std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::vector<float>>
        by_position;
    for (size_t i = 0; i < idx.size(); ++i) {
      const auto& v = info.row_voxel_index[i];
      std::vector<float> row(x.begin() + 6 * i, x.begin() + 6 * (i + 1));
      row.insert(row.end(), c.begin() + 4 * i, c.begin() + 4 * (i + 1));
      row.push_back(float(y[i]));
      by_position[{info.row_volume_ids[i], v[0], v[1], v[2]}] = row;
    }
    return std::make_pair(info.row_volume_ids, by_position);
  };
  const auto a = rows(dir.file("a.h5"));
  const auto s = rows(dir.file("s.h5"));
  EXPECT_EQ(a, rows(dir.file("b.h5")));
  EXPECT_EQ(a.second, s.second) << "the same rows";
  EXPECT_NE(a.first, s.first) << "in another order";
  EXPECT_NE(a.second, rows(dir.file("v.h5")).second) << "another split";
  EXPECT_EQ(a.second.size(), 2u * 64u);
}

// Without noise a row's local features are its class's centre and its
// context the class mix of its neighbourhood: context tells rows of one
// class apart by what surrounds them.
TEST(VolumeRows, ContextCarriesTheNeighbourhood) {
  test::TempDir dir("vrows");
  SyntheticSpec spec = patch_spec(2, 6);
  spec.noise = 0.0;
  make_synthetic(spec, dir.file("a.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("a.h5"), "t");
  const DatasetInfo& info = ds.info();
  const int64_t n = info.num_samples;
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i)
    idx[i] = i;
  std::vector<float> x(n * 6), c(n * 4);
  std::vector<int64_t> y(n);
  ds.read(idx, x.data(), y.data(), c.data());
  std::map<int64_t, std::set<std::vector<float>>> local, context;
  for (int64_t i = 0; i < n; ++i) {
    local[y[i]].insert({x.begin() + 6 * i, x.begin() + 6 * (i + 1)});
    context[y[i]].insert({c.begin() + 4 * i, c.begin() + 4 * (i + 1)});
  }
  ASSERT_EQ(local.size(), 2u);
  EXPECT_EQ(local[0].size(), 1u) << "local features: the class centre";
  EXPECT_EQ(local[1].size(), 1u);
  EXPECT_NE(*local[0].begin(), *local[1].begin());
  EXPECT_GT(context[0].size(), 2u) << "background rows near and far";
  EXPECT_GT(context[1].size(), 1u) << "blob rows at the core and the edge";
}

class VolumeRowsLayout : public ::testing::Test {
 protected:
  void SetUp() override {
    make_synthetic(patch_spec(2, 2), good());  // 16 rows
  }
  std::string good() const {
    return dir_.file("good.h5");
  }
  // The open error of the good file with `edit` applied.
  std::string error_after(const std::function<void(const std::string&)>& edit) {
    const std::string p = dir_.file("bad" + std::to_string(n_++) + ".h5");
    std::filesystem::copy_file(good(), p);
    edit(p);
    return test::open_error(p);
  }
  test::TempDir dir_{"vrows-layout"};
  int n_ = 0;
};

std::vector<int64_t> ids16() {
  std::vector<int64_t> ids(16);
  for (int i = 0; i < 16; ++i)
    ids[i] = i / 8;
  return ids;
}

std::vector<int64_t> voxels16() {
  std::vector<int64_t> v;
  for (int i = 0; i < 16; ++i) {
    const int k = i % 8;
    v.insert(v.end(), {k / 4, (k / 2) % 2, k % 2});
  }
  return v;
}

#define EXPECT_HAS(text, part) \
  EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(VolumeRowsLayout, GoodFileOpensAndMessagesNameTheProblem) {
  EXPECT_EQ(test::open_error(good()), "");
  const std::string where = "data.train: '" + dir_.path() + "/bad";

  std::string e = error_after([](const std::string& p) {
    test::put_int64_dataset(p, "voxel_index", {}, {});
  });
  EXPECT_HAS(e, where);
  EXPECT_HAS(
      e,
      ".h5': has /volume_ids without /voxel_index; rows that "
      "belong to volumes need both");
  e = error_after([](const std::string& p) {
    test::put_int64_dataset(p, "volume_ids", {}, {});
  });
  EXPECT_HAS(e, "has /voxel_index without /volume_ids");

  e = error_after([](const std::string& p) {
    std::vector<int64_t> ids = ids16();
    ids.pop_back();
    test::put_int64_dataset(p, "volume_ids", {15}, ids);
  });
  EXPECT_HAS(
      e,
      "dataset '/volume_ids': has 15 rows but '/features' has 16; "
      "they must be equal");
  e = error_after([](const std::string& p) {
    test::put_int64_dataset(
        p, "voxel_index", {16}, std::vector<int64_t>(16, 0));
  });
  EXPECT_HAS(e, "dataset '/voxel_index': expected 2-D [N, 3], found 1-D [16]");
  e = error_after([](const std::string& p) {
    test::put_int64_dataset(
        p, "voxel_index", {16, 2}, std::vector<int64_t>(32, 0));
  });
  EXPECT_HAS(
      e,
      "dataset '/voxel_index': expected 2-D [N, 3], found 2-D "
      "[16,2]");
  e = error_after([](const std::string& p) {
    test::put_int64_dataset(p, "volume_ids", {16, 1}, ids16());
  });
  EXPECT_HAS(e, "dataset '/volume_ids': expected 1-D [N], found 2-D [16,1]");
  e = error_after([](const std::string& p) {
    test::put_int64_dataset(p, "volume_ids", {16}, ids16(), H5T_IEEE_F32LE);
  });
  EXPECT_HAS(
      e,
      "dataset '/volume_ids': expected integer values, found "
      "float32");

  e = error_after([](const std::string& p) {
    std::vector<int64_t> ids = ids16();
    ids[5] = -3;
    test::put_int64_dataset(p, "volume_ids", {16}, ids);
  });
  EXPECT_HAS(
      e,
      "dataset '/volume_ids': value -3 at row 5 is negative; "
      "volume ids are >= 0");
  e = error_after([](const std::string& p) {
    std::vector<int64_t> v = voxels16();
    v[3 * 2 + 1] = -1;
    test::put_int64_dataset(p, "voxel_index", {16, 3}, v);
  });
  EXPECT_HAS(
      e,
      "dataset '/voxel_index': value -1 at row 2, axis 1 is "
      "negative; voxel indices are >= 0");

  // Row 9 (volume 1, voxel [0,0,1]) moved onto row 12's position.
  e = error_after([](const std::string& p) {
    std::vector<int64_t> v = voxels16();
    v[3 * 9] = 1, v[3 * 9 + 1] = 0, v[3 * 9 + 2] = 0;
    test::put_int64_dataset(p, "voxel_index", {16, 3}, v);
  });
  EXPECT_HAS(
      e,
      "dataset '/voxel_index': rows 9 and 12 are both volume 1, "
      "voxel [1,0,0]; each position of a volume is given once");
  // The same voxel in two volumes is no repeat.
  e = error_after([](const std::string& p) {
    std::vector<int64_t> ids = ids16();
    ids[0] = 7;
    test::put_int64_dataset(p, "volume_ids", {16}, ids);
  });
  EXPECT_EQ(e, "");

  e = error_after([](const std::string& p) {
    std::vector<int64_t> v = voxels16();
    v[0] = 1 << 20, v[1] = 1 << 11;
    test::put_int64_dataset(p, "voxel_index", {16, 3}, v);
  });
  EXPECT_HAS(
      e,
      "dataset '/voxel_index': volume 0 spans a grid of 1048577 x "
      "2049 x 2 positions (max voxel_index + 1 per axis), more "
      "than 2^31");
}

TEST_F(VolumeRowsLayout, OnlyFeaturesFilesCarryThem) {
  const std::string p = dir_.file("images.h5");
  test::RawH5 raw;
  raw.images_shape = {16, 1, 2, 2};
  raw.labels_shape = {16};
  test::write_raw_h5(p, raw);
  test::put_int64_dataset(p, "volume_ids", {16}, ids16());
  test::put_int64_dataset(p, "voxel_index", {16, 3}, voxels16());
  EXPECT_HAS(
      test::open_error(p),
      "has /volume_ids but holds /images; only /features files carry rows "
      "that belong to volumes");
}

// Ids with gaps, rows in any order: grouped by id, ascending; datasets
// written without a checksum are named like the others.
TEST_F(VolumeRowsLayout, RowsInAnyOrderAreGroupedByVolume) {
  const std::string p = dir_.file("order.h5");
  std::filesystem::copy_file(good(), p);
  std::vector<int64_t> ids = ids16();
  for (auto& id : ids)
    id = id == 0 ? 42 : 5;
  std::reverse(ids.begin(), ids.end());
  std::vector<int64_t> v = voxels16();
  v[3 * 15] = 3;  // row 15: volume 42, voxel [3, 1, 1]
  test::put_int64_dataset(p, "volume_ids", {16}, ids, H5T_STD_U16LE);
  test::put_int64_dataset(p, "voxel_index", {16, 3}, v, H5T_STD_I32LE);
  const H5Dataset ds = H5Dataset::open(p, "t");
  const DatasetInfo& info = ds.info();
  EXPECT_EQ(info.row_volume_ids, ids);
  EXPECT_EQ(flat_voxels(info), v);
  EXPECT_FALSE(info.checksummed);
  EXPECT_EQ(
      info.unchecksummed,
      (std::vector<std::string>{"/volume_ids", "/voxel_index"}));
  const VolumeRowIndex index = index_volume_rows(info);
  EXPECT_EQ(index.ids, (std::vector<int64_t>{5, 42}));
  EXPECT_EQ(index.rows[0], (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(
      index.rows[1], (std::vector<int64_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(index.extent[0], (std::array<int64_t, 3>{2, 2, 2}));
  EXPECT_EQ(index.extent[1], (std::array<int64_t, 3>{4, 2, 2}));
  EXPECT_EQ(index.grid_voxels(1), 16);
  EXPECT_EQ(index.grid_offset(1, {3, 1, 0}), 14);
  EXPECT_EQ(
      describe_volume_rows(index),
      "2 volume(s) (ids 5..42), grid(s) 2x2x2 (1) 4x2x2 (1)");
}

TEST(VolumeRows, PredictionFileHoldsTheGridAndItsAttributes) {
  test::TempDir dir("vrows-dump");
  const std::string path = dir.file("val/epoch-002/volume-17.h5");
  std::vector<int16_t> grid(2 * 3 * 4);
  for (size_t i = 0; i < grid.size(); ++i)
    grid[i] = static_cast<int16_t>(int(i % 5) - 1);
  write_volume_prediction(path, 17, 0.625, {2, 3, 4}, grid);
  write_volume_prediction(
      dir.file("val/epoch-002/volume-3.h5"), 3, std::nan(""), {1, 1, 1}, {-1});
  // Nothing but the two files: no temporary left behind.
  std::set<std::string> names;
  for (const auto& e :
       std::filesystem::directory_iterator(dir.file("val/epoch-002")))
    names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"volume-17.h5", "volume-3.h5"}));

  const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t ds = H5Dopen2(f, "prediction", H5P_DEFAULT);
  ASSERT_GE(ds, 0);
  const hid_t sp = H5Dget_space(ds);
  hsize_t dims[3] = {0, 0, 0};
  ASSERT_EQ(H5Sget_simple_extent_ndims(sp), 3);
  H5Sget_simple_extent_dims(sp, dims, nullptr);
  EXPECT_EQ(
      std::vector<hsize_t>(dims, dims + 3), (std::vector<hsize_t>{2, 3, 4}));
  const hid_t t = H5Dget_type(ds);
  EXPECT_EQ(H5Tget_size(t), 2u);
  EXPECT_EQ(H5Tget_sign(t), H5T_SGN_2);
  std::vector<int16_t> back(grid.size());
  H5Dread(ds, H5T_NATIVE_INT16, H5S_ALL, H5S_ALL, H5P_DEFAULT, back.data());
  EXPECT_EQ(back, grid);
  const hid_t plist = H5Dget_create_plist(ds);
  bool fletcher = false;
  for (int i = 0; i < H5Pget_nfilters(plist); ++i) {
    unsigned flags = 0;
    size_t nelem = 0;
    fletcher |= H5Pget_filter2(
                    plist, i, &flags, &nelem, nullptr, 0, nullptr, nullptr) ==
                H5Z_FILTER_FLETCHER32;
  }
  EXPECT_TRUE(fletcher);
  int64_t id = 0;
  double dice = 0;
  const hid_t a1 = H5Aopen(f, "volume_id", H5P_DEFAULT);
  const hid_t a2 = H5Aopen(f, "dice", H5P_DEFAULT);
  H5Aread(a1, H5T_NATIVE_INT64, &id);
  H5Aread(a2, H5T_NATIVE_DOUBLE, &dice);
  EXPECT_EQ(id, 17);
  EXPECT_EQ(dice, 0.625);
  H5Aclose(a1);
  H5Aclose(a2);
  H5Pclose(plist);
  H5Tclose(t);
  H5Sclose(sp);
  H5Dclose(ds);
  H5Fclose(f);
}

}  // namespace
}  // namespace memtrain
