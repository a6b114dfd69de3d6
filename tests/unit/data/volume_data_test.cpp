// Volume files: patch reads by hyperslab, the patch sampler, the layout
// warnings, bad volume files, and the prefetcher.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <set>
#include <stdexcept>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/input/batch_loader.h"
#include "memtrain/input/prefetcher.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

SyntheticSpec volume_spec() {
  SyntheticSpec s;
  s.kind = "volumes";
  s.samples = 3;
  s.channels = 2;
  s.depth = 12;
  s.height = 10;
  s.width = 14;
  s.classes = 3;
  s.chunk = 4;
  return s;
}

// A patch read by hyperslab is exactly the box of the whole volume, for
// every channel, with the intensity normalisation applied.
TEST(VolumeData, PatchEqualsTheBoxOfTheWholeVolume) {
  test::TempDir dir("vol");
  for (const std::string dtype : {"float32", "int16", "uint8"}) {
    SyntheticSpec spec = volume_spec();
    spec.dtype = dtype;
    const std::string path = dir.file(dtype + ".h5");
    make_synthetic(spec, path);
    const H5Dataset ds = H5Dataset::open(path, "t");
    const DatasetInfo& info = ds.info();
    ASSERT_EQ(info.kind, SampleKind::kVolumes);
    ASSERT_EQ(info.sample_shape, (std::vector<int64_t>{2, 12, 10, 14}));
    ASSERT_EQ(info.chunk_shape, (std::vector<int64_t>{2, 4, 4, 4}));
    const at::Tensor whole = torch::empty({2, 12, 10, 14});
    const at::Tensor mask = torch::empty({12, 10, 14}, torch::kInt64);
    ds.read({1}, whole.data_ptr<float>(), mask.data_ptr<int64_t>());
    const std::array<int64_t, 3> corner{3, 2, 5}, size{6, 8, 7};
    const at::Tensor x = torch::empty({2, 6, 8, 7});
    const at::Tensor y = torch::empty({6, 8, 7}, torch::kInt64);
    ds.read_patch(1, corner, size, x.data_ptr<float>(), y.data_ptr<int64_t>());
    using torch::indexing::Slice;
    const at::Tensor box =
        whole.index({Slice(), Slice(3, 9), Slice(2, 10), Slice(5, 12)});
    EXPECT_TRUE(torch::equal(x, box)) << dtype;
    EXPECT_TRUE(
        torch::equal(y, mask.index({Slice(3, 9), Slice(2, 10), Slice(5, 12)})))
        << dtype;
    // The float file is the reference: quantised files are normalised back
    // to within their quantisation step.
    if (dtype != "float32") {
      const H5Dataset ref = H5Dataset::open(dir.file("float32.h5"), "t");
      const at::Tensor rx = torch::empty({2, 6, 8, 7});
      ref.read_patch(
          1, corner, size, rx.data_ptr<float>(), y.data_ptr<int64_t>());
      const double step = dtype == "uint8" ? 1.0 / 16 : 1.0 / 1000;
      // uint8 clamps the far tails of the noise; compare the typical voxel.
      EXPECT_LT((x - rx).abs().median().item<double>(), step) << dtype;
    }
  }
}

TEST(VolumeData, MasksAreCheckedCountedAndIndexed) {
  test::TempDir dir("vol");
  make_synthetic(volume_spec(), dir.file("v.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("v.h5"), "t");
  const DatasetInfo& info = ds.info();
  EXPECT_EQ(info.num_classes, 3);
  int64_t total = 0;
  for (int64_t c : info.label_counts)
    total += c;
  EXPECT_EQ(total, 3 * 12 * 10 * 14);
  for (int64_t v = 0; v < 3; ++v) {
    const at::Tensor mask = torch::empty({12, 10, 14}, torch::kInt64);
    const at::Tensor x = torch::empty({2, 12, 10, 14});
    ds.read({v}, x.data_ptr<float>(), mask.data_ptr<int64_t>());
    const at::Tensor fg = mask.reshape({-1}).gt(0).nonzero().reshape({-1});
    const auto& idx = ds.foreground(v);
    ASSERT_EQ(static_cast<int64_t>(idx.size()), fg.size(0));
    for (size_t i = 0; i < idx.size(); ++i)
      ASSERT_EQ(idx[i], fg[i].item<int64_t>());
  }
}

TEST(VolumeData, PatchSamplerIsReproducibleAndFindsForeground) {
  test::TempDir dir("vol");
  make_synthetic(volume_spec(), dir.file("v.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("v.h5"), "t");
  const std::array<int64_t, 3> patch{4, 4, 4};
  const PatchSampler a(ds, patch, 5, 1.0, 7), b(ds, patch, 5, 1.0, 7);
  const PatchSampler c(ds, patch, 5, 1.0, 8), uniform(ds, patch, 5, 0.0, 7);
  EXPECT_EQ(a.num_samples(), 15);
  int same_epoch = 0, same_seed = 0;
  for (int64_t i = 0; i < a.num_samples(); ++i) {
    const PatchRef r = a.at(0, i);
    EXPECT_EQ(r.volume, i % 3);
    EXPECT_EQ(r.corner, b.at(0, i).corner);  // same seed, epoch, sample
    same_epoch += r.corner == a.at(1, i).corner;
    same_seed += r.corner == c.at(0, i).corner;
    EXPECT_TRUE(r.foreground);
    EXPECT_FALSE(uniform.at(0, i).foreground);
    // pos_fraction 1: the patch holds a foreground voxel.
    const at::Tensor x = torch::empty({2, 4, 4, 4});
    const at::Tensor y = torch::empty({4, 4, 4}, torch::kInt64);
    ds.read_patch(
        r.volume, r.corner, patch, x.data_ptr<float>(), y.data_ptr<int64_t>());
    EXPECT_GT(y.gt(0).sum().item<int64_t>(), 0) << "sample " << i;
    for (int d = 0; d < 3; ++d) {
      EXPECT_GE(r.corner[d], 0);
      EXPECT_LE(r.corner[d] + patch[d], ds.info().sample_shape[d + 1]);
    }
  }
  EXPECT_LT(same_epoch, 5);  // another epoch, other patches
  EXPECT_LT(same_seed, 5);
}

TEST(VolumeData, PatchLargerThanTheVolumeNamesTheFile) {
  test::TempDir dir("vol");
  make_synthetic(volume_spec(), dir.file("v.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("v.h5"), "t");
  try {
    PatchSampler(ds, {8, 16, 8}, 1, 0.5, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("data.patch_size=[8, 16, 8]"), std::string::npos) << m;
    EXPECT_NE(m.find(dir.file("v.h5")), std::string::npos) << m;
    EXPECT_NE(m.find("[12, 10, 14]"), std::string::npos) << m;
  }
}

TEST(VolumeData, ChunkLayoutWarnings) {
  test::TempDir dir("vol");
  SyntheticSpec spec = volume_spec();
  make_synthetic(spec, dir.file("good.h5"));
  // make-data always chunks (Fletcher32 needs chunks): another tool's file.
  test::RawH5 contiguous;
  contiguous.volumes_shape = {3, 2, 12, 10, 14};
  contiguous.masks_shape = {3, 12, 10, 14};
  test::write_raw_h5(dir.file("contiguous.h5"), contiguous);
  spec.chunk = 12;
  make_synthetic(spec, dir.file("big.h5"));
  const std::array<int64_t, 3> patch{8, 8, 8};
  EXPECT_EQ(
      H5Dataset::open(dir.file("good.h5"), "t").patch_layout_warning(patch),
      "");
  const std::string c = H5Dataset::open(dir.file("contiguous.h5"), "t")
                            .patch_layout_warning(patch);
  EXPECT_NE(
      c.find("contiguous.h5' dataset '/volumes' is contiguous"),
      std::string::npos)
      << c;
  EXPECT_NE(c.find("h5repack -l /volumes:CHUNK=1x2x4x4x4"), std::string::npos)
      << c;
  const std::string b =
      H5Dataset::open(dir.file("big.h5"), "t").patch_layout_warning(patch);
  EXPECT_NE(
      b.find("chunks [12,10,12] larger than the patch [8,8,8]"),
      std::string::npos)
      << b;
  // inspect shows it too, and still reports no problem (it trains, slowly).
  const InspectReport r = inspect_file(dir.file("contiguous.h5"));
  EXPECT_TRUE(r.ok);
  EXPECT_NE(r.text.find("warning: "), std::string::npos) << r.text;
}

TEST(VolumeData, BadVolumeFilesNameFileAndDataset) {
  test::TempDir dir("vol");
  test::RawH5 shape;
  shape.volumes_shape = {2, 1, 4, 5, 6};
  shape.masks_shape = {2, 4, 5, 7};
  test::write_raw_h5(dir.file("shape.h5"), shape);
  EXPECT_NE(
      test::open_error(dir.file("shape.h5"))
          .find("shape.h5' dataset '/masks': shape [2,4,5,7] does not match "
                "/volumes [2,1,4,5,6]; expected [2,4,5,6]"),
      std::string::npos)
      << test::open_error(dir.file("shape.h5"));

  test::RawH5 range;
  range.volumes_shape = {1, 1, 4, 5, 6};
  range.masks_shape = {1, 4, 5, 6};
  range.mask_max = 5;
  range.num_classes_attr = 3;
  test::write_raw_h5(dir.file("range.h5"), range);
  EXPECT_NE(
      test::open_error(dir.file("range.h5"))
          .find("range.h5' dataset '/masks': label 5 at volume 0, voxel "
                "[3,4,5] is outside 0..2"),
      std::string::npos)
      << test::open_error(dir.file("range.h5"));

  test::RawH5 no_masks;
  no_masks.volumes_shape = {1, 1, 4, 5, 6};
  test::write_raw_h5(dir.file("nomask.h5"), no_masks);
  EXPECT_NE(
      test::open_error(dir.file("nomask.h5")).find("dataset '/masks': missing"),
      std::string::npos);
}

TEST(VolumeData, ContextFeaturesAreReadRowForRow) {
  test::TempDir dir("ctx");
  SyntheticSpec spec;
  spec.samples = 40;
  spec.features = 6;
  spec.context = 5;
  make_synthetic(spec, dir.file("c.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("c.h5"), "t");
  ASSERT_EQ(ds.info().context_features, 5);
  std::vector<float> x(2 * 6), c(2 * 5), c1(5), c2(5);
  std::vector<int64_t> y(2), y1(1);
  ds.read({17, 3}, x.data(), y.data(), c.data());
  ds.read({17}, x.data(), y1.data(), c1.data());
  ds.read({3}, x.data(), y1.data(), c2.data());
  EXPECT_EQ(std::vector<float>(c.begin(), c.begin() + 5), c1);
  EXPECT_EQ(std::vector<float>(c.begin() + 5, c.end()), c2);
}

// A source that counts reads and can fail on one sample.
class CountingSource : public SampleSource {
 public:
  mutable std::atomic<int> reads{0};
  int64_t fail_on = -1;
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override {
    ++reads;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (ids[k] == fail_on)
        throw Error("sample " + std::to_string(ids[k]) + " is unreadable");
      into.x[k].fill_(double(epoch * 1000 + ids[k]));
      into.y[k] = ids[k];
    }
  }
  Batch allocate(int64_t n, bool) const override {
    return {torch::empty({n, 3}), torch::empty({n}, torch::kInt64), {}};
  }
};

TEST(Prefetcher, ReturnsTheExpectedBatchesInOrder) {
  for (int64_t depth : {0, 1, 3}) {
    CountingSource src;
    Prefetcher p(src, depth, 2);
    const std::vector<std::vector<int64_t>> batches = {
        {4, 1}, {7, 2}, {9, 0}, {3}};
    p.expect(2, batches);
    for (const auto& ids : batches) {
      const Batch b = p.load(2, ids);
      ASSERT_EQ(b.size(), static_cast<int64_t>(ids.size()));
      for (size_t k = 0; k < ids.size(); ++k) {
        EXPECT_EQ(b.y[k].item<int64_t>(), ids[k]);
        EXPECT_EQ(b.x[k][0].item<float>(), 2000.0f + ids[k]);
      }
      p.recycle(b);
    }
    EXPECT_EQ(src.reads.load(), 4) << "depth " << depth;
    if (depth == 0) {
      EXPECT_EQ(p.misses(), 4);
    }
    // A batch nobody expected (an OOM replay) is read in place, right.
    const Batch other = p.load(5, {1, 2, 3});
    EXPECT_EQ(other.x[2][0].item<float>(), 5003.0f);
  }
}

TEST(Prefetcher, ReadErrorsReachTheTrainingThread) {
  CountingSource src;
  src.fail_on = 9;
  Prefetcher p(src, 2, 2);
  p.expect(0, {{1}, {9}});
  EXPECT_EQ(p.load(0, {1}).y[0].item<int64_t>(), 1);
  try {
    p.load(0, {9});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "sample 9 is unreadable");
  }
}

// NaN/Inf in the rows read is named by file, dataset and row the first time
// (training.nonfinite): stop throws; skip warns once and stops looking.
TEST(FiniteCheck, NamesTheFileDatasetAndRowsOfTheFirstBadBatch) {
  test::TempDir dir("finite");
  const std::string path = dir.file("nan.h5");
  test::RawH5 spec;
  spec.features_shape = {10, 4};
  spec.labels_shape = {10};
  spec.nan_row = 7;
  test::write_raw_h5(path, spec);
  const H5Dataset data = H5Dataset::open(path, "data.train");
  const FiniteCheck stop("data.train", true);
  const RowSource stopping(data, {}, &stop);
  Batch b = stopping.allocate(3, false);
  stopping.read(0, {2, 5, 3}, b);  // finite rows: nothing said
  EXPECT_EQ(
      test::error_of([&] {
        stopping.read(1, {2, 7, 5}, b);
      }),
      "data.train '" + path +
          "' dataset '/features': row 7 holds nan (element 0), read in epoch "
          "2; training.nonfinite=stop: stopped before any update from it. Fix "
          "or drop those samples (or set training.nonfinite=skip to skip the "
          "windows they reach)");
  // The batch still holds what was read: the reader reports, never patches.
  EXPECT_TRUE(std::isnan(b.x[1][0].item<float>()));

  const FiniteCheck skip("data.train", false);
  const RowSource skipping(data, {}, &skip);
  EXPECT_EQ(test::error_of([&] { skipping.read(0, {7, 1, 2}, b); }), "");
  EXPECT_EQ(test::error_of([&] { skipping.read(0, {7, 1, 2}, b); }), "");
}

}  // namespace
}  // namespace memtrain
