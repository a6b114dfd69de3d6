#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include <fstream>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

TEST(H5Dataset, SyntheticFeaturesRoundTrip) {
  test::TempDir dir("h5");
  SyntheticSpec spec;
  spec.samples = 50;
  spec.features = 6;
  spec.classes = 3;
  make_synthetic(spec, dir.file("a.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("a.h5"), "data.train");
  EXPECT_EQ(ds.info().kind, SampleKind::kFeatures);
  EXPECT_EQ(ds.info().num_samples, 50);
  EXPECT_EQ(ds.info().sample_shape, std::vector<int64_t>{6});
  EXPECT_EQ(ds.info().num_classes, 3);
  EXPECT_EQ(ds.info().class_names.size(), 3u);

  // Rows come back in the order asked, repeats included.
  std::vector<float> x1(6), x_all(3 * 6);
  std::vector<int64_t> y1(1), y_all(3);
  ds.read({17}, x1.data(), y1.data());
  ds.read({40, 17, 17}, x_all.data(), y_all.data());
  for (int j = 0; j < 6; ++j) {
    EXPECT_EQ(x_all[6 + j], x1[j]);
    EXPECT_EQ(x_all[12 + j], x1[j]);
  }
  EXPECT_EQ(y_all[1], y1[0]);
  EXPECT_NE(x_all[0], x1[0]);
}

// Regression files (docs/data-format.md, "Targets"): /targets rows come back in
// the order asked with their samples, no labels; the synthetic targets
// are W x + b + noise, the same W and b in every split of one seed.
TEST(H5Dataset, TargetsRoundTripInTheOrderAsked) {
  test::TempDir dir("h5targets");
  SyntheticSpec spec;
  spec.kind = "regression";
  spec.samples = 40;
  spec.features = 5;
  spec.targets = 3;
  spec.noise = 0.0;
  make_synthetic(spec, dir.file("r.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("r.h5"), "data.train");
  const DatasetInfo& info = ds.info();
  EXPECT_EQ(info.kind, SampleKind::kFeatures);
  EXPECT_EQ(info.targets, 3);
  EXPECT_EQ(info.num_classes, 0);
  EXPECT_TRUE(info.row_labels.empty());
  std::vector<float> x(40 * 5), t(40 * 3);
  std::vector<int64_t> all(40);
  for (int64_t i = 0; i < 40; ++i)
    all[i] = i;
  ds.read(all, x.data(), nullptr, nullptr, t.data());
  std::vector<float> x2(3 * 5), t2(3 * 3);
  ds.read({31, 2, 31}, x2.data(), nullptr, nullptr, t2.data());
  const int64_t order[] = {31, 2, 31};
  for (int k = 0; k < 3; ++k) {
    for (int j = 0; j < 5; ++j)
      EXPECT_EQ(x2[k * 5 + j], x[order[k] * 5 + j]);
    for (int j = 0; j < 3; ++j)
      EXPECT_EQ(t2[k * 3 + j], t[order[k] * 3 + j]);
  }
  // Noise 0: the targets are affine in the features; the same map in the
  // val split (least squares over each file's 40 rows recovers it).
  spec.split = "val";
  make_synthetic(spec, dir.file("v.h5"));
  const H5Dataset val = H5Dataset::open(dir.file("v.h5"), "data.val");
  std::vector<float> xv(40 * 5), tv(40 * 3);
  val.read(all, xv.data(), nullptr, nullptr, tv.data());
  const auto fit = [](const std::vector<float>& xs,
                      const std::vector<float>& ts) {
    const at::Tensor a = torch::cat(
        {torch::from_blob(const_cast<float*>(xs.data()), {40, 5})
             .to(torch::kFloat64),
         torch::ones({40, 1}, torch::kFloat64)},
        1);
    const at::Tensor b =
        torch::from_blob(const_cast<float*>(ts.data()), {40, 3})
            .to(torch::kFloat64);
    return at::linalg_solve(a.t().mm(a), a.t().mm(b));  // least squares
  };
  const at::Tensor wb = fit(x, t), wb_val = fit(xv, tv);
  EXPECT_LT((wb - wb_val).abs().max().item<double>(), 1e-5);
  EXPECT_GT(wb.abs().max().item<double>(), 0.1) << "a map worth fitting";
  EXPECT_NE(xv[0], x[0]) << "another split, other rows";
}

// /labels and /targets in one file, /targets of another N or 1-D: one
// line naming the file, the dataset and the rule.
TEST(H5Dataset, BadTargetsAreRefused) {
  test::TempDir dir("h5targets_bad");
  SyntheticSpec spec;
  spec.kind = "regression";
  spec.samples = 10;
  spec.features = 4;
  const auto with = [&](const std::string& name,
                        const std::vector<hsize_t>& dims,
                        hid_t type,
                        const char* dataset) {
    const std::string path = dir.file(name);
    make_synthetic(spec, path);
    const hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    if (std::string(dataset) == "targets")
      H5Ldelete(f, "targets", H5P_DEFAULT);
    const hid_t space =
        H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    const hid_t ds = H5Dcreate2(
        f, dataset, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
    return test::open_error(path);
  };
  const std::string both = with("both.h5", {10}, H5T_STD_I64LE, "labels");
  EXPECT_NE(both.find("has /targets and /labels"), std::string::npos) << both;
  const std::string rows = with("rows.h5", {9, 2}, H5T_IEEE_F32LE, "targets");
  EXPECT_NE(
      rows.find("dataset '/targets': has 9 rows but '/features' has 10"),
      std::string::npos)
      << rows;
  const std::string flat = with("flat.h5", {10}, H5T_IEEE_F32LE, "targets");
  EXPECT_NE(
      flat.find("dataset '/targets': expected 2-D [N, T]"), std::string::npos)
      << flat;
  const std::string ints = with("ints.h5", {10, 2}, H5T_STD_I32LE, "targets");
  EXPECT_NE(ints.find("expected float32 or float64"), std::string::npos)
      << ints;
  for (const auto& e : {both, rows, flat, ints})
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
}

TEST(H5Dataset, SyntheticIsDeterministicAndSplitsDiffer) {
  test::TempDir dir("h5");
  SyntheticSpec spec;
  spec.samples = 20;
  make_synthetic(spec, dir.file("a.h5"));
  make_synthetic(spec, dir.file("b.h5"));
  spec.split = "val";
  make_synthetic(spec, dir.file("c.h5"));
  auto read_all = [](const std::string& p) {
    const H5Dataset ds = H5Dataset::open(p, "t");
    std::vector<int64_t> idx(20);
    for (int i = 0; i < 20; ++i)
      idx[i] = i;
    std::vector<float> x(20 * ds.info().sample_numel());
    std::vector<int64_t> y(20);
    ds.read(idx, x.data(), y.data());
    return x;
  };
  EXPECT_EQ(read_all(dir.file("a.h5")), read_all(dir.file("b.h5")));
  EXPECT_NE(read_all(dir.file("a.h5")), read_all(dir.file("c.h5")));
}

TEST(H5Dataset, Uint8ImagesAreScaled) {
  test::TempDir dir("h5");
  SyntheticSpec spec;
  spec.kind = "images";
  spec.samples = 8;
  spec.channels = 2;
  spec.height = 4;
  spec.width = 5;
  spec.dtype = "uint8";
  make_synthetic(spec, dir.file("u8.h5"));
  spec.dtype = "float32";
  make_synthetic(spec, dir.file("f32.h5"));
  const H5Dataset q = H5Dataset::open(dir.file("u8.h5"), "t");
  const H5Dataset f = H5Dataset::open(dir.file("f32.h5"), "t");
  EXPECT_EQ(q.info().sample_dtype, "uint8");
  EXPECT_EQ(q.info().sample_shape, (std::vector<int64_t>{2, 4, 5}));
  std::vector<float> xq(40), xf(40);
  std::vector<int64_t> y(1);
  q.read({3}, xq.data(), y.data());
  f.read({3}, xf.data(), y.data());
  for (int i = 0; i < 40; ++i) {
    // Quantisation step 1/32; values within +-4 are not clipped.
    if (std::abs(xf[i]) < 3.9f)
      EXPECT_NEAR(xq[i], xf[i], 0.5f / 32 + 1e-6);
  }
}

struct BadCase {
  const char* name;
  test::RawH5 spec;
  const char* expect;  // substring of the message
};

TEST(H5Dataset, BadFilesNameFileAndDataset) {
  test::TempDir dir("h5bad");
  // Missing file.
  EXPECT_NE(
      test::open_error(dir.file("none.h5")).find("no such file"),
      std::string::npos);
  EXPECT_NE(
      test::open_error(dir.file("none.h5")).find("none.h5"), std::string::npos);
  // Not HDF5.
  std::ofstream(dir.file("text.h5")) << "just text\n";
  EXPECT_NE(
      test::open_error(dir.file("text.h5")).find("not an HDF5 file"),
      std::string::npos);

  const std::vector<BadCase> cases = {
      {"rank3.h5", {{10, 4, 2}, {}, {10}}, "dataset '/features': expected 2-D"},
      {"intfeat.h5",
       {{10, 4}, {}, {10}, false, true},
       "dataset '/features': expected float32"},
      {"floatlabels.h5",
       {{10, 4}, {}, {10}, true},
       "dataset '/labels': expected integer labels"},
      {"mismatch.h5",
       {{10, 4}, {}, {9}},
       "dataset '/labels': has 9 labels but '/features' has 10"},
      {"empty.h5", {{0, 4}, {}, {0}}, "dataset '/features': is empty"},
      {"nolabels.h5", {{10, 4}, {}, {}}, "dataset '/labels': missing"},
      {"nothing.h5",
       {{}, {}, {10}},
       "has no /features, /images or /volumes dataset"},
      {"images3d.h5",
       {{}, {10, 4, 4}, {10}},
       "dataset '/images': expected 4-D"},
      {"labels2d.h5",
       {{10, 4}, {}, {10, 2}},
       "dataset '/labels': expected 1-D"},
      {"range.h5",
       {{4, 2}, {}, {4}, false, false, {0, 1, 5, 1}, 3},
       "label 5 at index 2 is outside 0..2"},
      {"negative.h5",
       {{4, 2}, {}, {4}, false, false, {0, -1, 1, 1}},
       "label -1 at index 1 is negative"},
  };
  for (const auto& c : cases) {
    const std::string path = dir.file(c.name);
    test::write_raw_h5(path, c.spec);
    const std::string e = test::open_error(path);
    EXPECT_NE(e.find(c.expect), std::string::npos)
        << c.name << ": got '" << e << "'";
    EXPECT_NE(e.find(path), std::string::npos) << c.name << ": " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "one line: " << e;
    EXPECT_FALSE(inspect_file(path).ok) << c.name;
  }
}

TEST(Inspect, ReportsLayoutOfAGoodFile) {
  test::TempDir dir("inspect");
  SyntheticSpec spec;
  spec.kind = "images";
  spec.samples = 12;
  make_synthetic(spec, dir.file("i.h5"));
  const InspectReport r = inspect_file(dir.file("i.h5"));
  EXPECT_TRUE(r.ok);
  EXPECT_NE(
      r.text.find("/images  float32 [12, 3, 16, 16]  chunks [1, 3, 16, 16]"),
      std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("problems: none"), std::string::npos);
}

}  // namespace
}  // namespace memtrain
