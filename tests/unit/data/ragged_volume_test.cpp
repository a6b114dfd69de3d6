// Ragged volume files (docs/data-format.md, "Cases of different shapes"): each
// case's own extent from /volume_shapes, whole-case and padded patch reads,
// the patch sampler inside each case, masks checked inside the cases only,
// bad /volume_shapes, and inspect's summary.

#include <gtest/gtest.h>
#include <hdf5.h>
#include <torch/torch.h>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

using torch::indexing::Slice;

SyntheticSpec ragged_spec() {
  SyntheticSpec s;
  s.kind = "volumes";
  s.samples = 5;
  s.channels = 2;
  s.depth = 12;
  s.height = 10;
  s.width = 14;
  s.classes = 3;
  s.chunk = 4;
  s.ragged = true;
  return s;
}

struct Case {
  at::Tensor x, y;
};

Case whole_case(const H5Dataset& ds, int64_t v) {
  const auto& e = ds.info().volume_shape(v);
  Case c{
      torch::empty({ds.info().sample_shape[0], e[0], e[1], e[2]}),
      torch::empty({e[0], e[1], e[2]}, torch::kInt64)};
  ds.read_volume(v, c.x.data_ptr<float>(), c.y.data_ptr<int64_t>());
  return c;
}

TEST(RaggedVolumes, EachCaseHasItsOwnShape) {
  test::TempDir dir("ragged");
  make_synthetic(ragged_spec(), dir.file("r.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("r.h5"), "t");
  const DatasetInfo& info = ds.info();
  ASSERT_TRUE(info.ragged);
  ASSERT_EQ(info.volume_shapes.size(), 5u);
  EXPECT_EQ(info.volume_shape(0), (std::array<int64_t, 3>{12, 10, 14}));
  const std::array<int64_t, 3> full{12, 10, 14};
  std::vector<int64_t> counts(3, 0);
  for (int64_t v = 0; v < 5; ++v) {
    const auto& e = info.volume_shape(v);
    for (int a = 0; a < 3; ++a) {
      EXPECT_GE(e[a], full[a] / 2) << v;
      EXPECT_LE(e[a], full[a]) << v;
    }
    const Case c = whole_case(ds, v);
    // The case's voxels hold the data (not the 0 padding of the array):
    // no plane at its far edge is all zero.
    EXPECT_GT(c.x.index({Slice(), -1}).abs().sum().item<double>(), 0) << v;
    EXPECT_GT(c.x.index({Slice(), Slice(), -1}).abs().sum().item<double>(), 0);
    for (int64_t k = 0; k < 3; ++k)
      counts[k] += c.y.eq(k).sum().item<int64_t>();
    // The foreground index is within the case's own grid.
    for (int64_t i : ds.foreground(v)) {
      ASSERT_LT(i, info.volume_voxels(v));
      EXPECT_GT(c.y.flatten()[i].item<int64_t>(), 0);
    }
  }
  // Voxels per class count the cases only, not the padding.
  EXPECT_EQ(info.label_counts, counts);
  int shapes_differ = 0;
  for (int64_t v = 1; v < 5; ++v)
    shapes_differ += info.volume_shape(v) != full;
  EXPECT_GE(shapes_differ, 3);
}

TEST(RaggedVolumes, PatchesPartlyOutsideACaseArePadded) {
  test::TempDir dir("ragged");
  make_synthetic(ragged_spec(), dir.file("r.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("r.h5"), "t");
  int64_t v = 1;
  while (ds.info().volume_shape(v)[2] == 14)
    ++v;
  const auto e = ds.info().volume_shape(v);
  const Case c = whole_case(ds, v);
  // Inside: exactly the box of the case.
  {
    const std::array<int64_t, 3> corner{1, 2, 3}, size{4, 4, 4};
    at::Tensor x = torch::empty({2, 4, 4, 4});
    at::Tensor y = torch::empty({4, 4, 4}, torch::kInt64);
    ds.read_patch(v, corner, size, x.data_ptr<float>(), y.data_ptr<int64_t>());
    EXPECT_TRUE(torch::equal(
        x, c.x.index({Slice(), Slice(1, 5), Slice(2, 6), Slice(3, 7)})));
    EXPECT_TRUE(
        torch::equal(y, c.y.index({Slice(1, 5), Slice(2, 6), Slice(3, 7)})));
  }
  // W: a patch of 14 at corner e - 14 < 0 holds the whole width of the
  // case at offset 14 - e, zeros before it; D: 3 voxels past the corner -2.
  const int64_t off = 14 - e[2];
  const std::array<int64_t, 3> corner{-2, 0, -off}, size{5, 4, 14};
  at::Tensor x = torch::full({2, 5, 4, 14}, 7.0f);
  at::Tensor y = torch::full({5, 4, 14}, 7, torch::kInt64);
  ds.read_patch(v, corner, size, x.data_ptr<float>(), y.data_ptr<int64_t>());
  EXPECT_TRUE(torch::equal(
      x.index({Slice(), Slice(2, 5), Slice(), Slice(off, 14)}),
      c.x.index({Slice(), Slice(0, 3), Slice(0, 4), Slice()})));
  EXPECT_TRUE(torch::equal(
      y.index({Slice(2, 5), Slice(), Slice(off, 14)}),
      c.y.index({Slice(0, 3), Slice(0, 4), Slice()})));
  EXPECT_EQ(x.index({Slice(), Slice(0, 2)}).abs().sum().item<double>(), 0);
  EXPECT_EQ(
      x.index({Slice(), Slice(), Slice(), Slice(0, off)})
          .abs()
          .sum()
          .item<double>(),
      0);
  EXPECT_EQ(y.index({Slice(0, 2)}).sum().item<int64_t>(), 0);
  EXPECT_EQ(
      y.index({Slice(), Slice(), Slice(0, off)}).sum().item<int64_t>(), 0);
}

TEST(RaggedVolumes, SamplerDrawsInsideEachCase) {
  test::TempDir dir("ragged");
  make_synthetic(ragged_spec(), dir.file("r.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("r.h5"), "t");
  // 12 on W: larger than some cases (padded), no larger than the array.
  const std::array<int64_t, 3> patch{6, 6, 12};
  const PatchSampler fg(ds, patch, 8, 1.0, 3), any(ds, patch, 8, 0.0, 3);
  for (int64_t i = 0; i < fg.num_samples(); ++i) {
    for (const PatchSampler* s : {&fg, &any}) {
      const PatchRef r = s->at(2, i);
      const auto& e = ds.info().volume_shape(r.volume);
      for (int a = 0; a < 3; ++a) {
        // Inside the case, or (case smaller) the case inside the patch
        // where the sliding window puts it: MONAI's symmetric padding.
        if (e[a] < patch[a]) {
          EXPECT_EQ(r.corner[a], -((patch[a] - e[a]) / 2));
        } else {
          EXPECT_GE(r.corner[a], 0);
          EXPECT_LE(r.corner[a], e[a] - patch[a]);
        }
      }
      at::Tensor x = torch::empty({2, 6, 6, 12});
      at::Tensor y = torch::empty({6, 6, 12}, torch::kInt64);
      ds.read_patch(
          r.volume,
          r.corner,
          patch,
          x.data_ptr<float>(),
          y.data_ptr<int64_t>());
      if (s == &fg) {
        EXPECT_TRUE(r.foreground);
        EXPECT_GT(y.gt(0).sum().item<int64_t>(), 0) << "sample " << i;
      }
    }
  }
  // validation.padding: end puts such a case at the patch's start; the
  // draws on the other axes are the same.
  const PatchSampler end(ds, patch, 8, 0.0, 3, Flip::kNone, Padding::kEnd);
  bool smaller = false;
  for (int64_t i = 0; i < end.num_samples(); ++i) {
    const PatchRef r = end.at(2, i), s = any.at(2, i);
    const auto& e = ds.info().volume_shape(r.volume);
    for (int a = 0; a < 3; ++a) {
      smaller = smaller || e[a] < patch[a];
      EXPECT_EQ(r.corner[a], e[a] < patch[a] ? 0 : s.corner[a]);
    }
  }
  EXPECT_TRUE(smaller);  // the spec has cases smaller than the patch
  // Larger than every case on D: refused, naming the file.
  const std::string m = test::error_of([&] {
    PatchSampler(ds, {13, 4, 4}, 1, 0.5, 0);
  });
  EXPECT_NE(m.find("larger than every case"), std::string::npos) << m;
  EXPECT_NE(m.find(dir.file("r.h5")), std::string::npos) << m;
}

TEST(RaggedVolumes, BadVolumeShapesNameTheDataset) {
  test::TempDir dir("ragged");
  const std::string p = dir.file("r.h5");
  make_synthetic(ragged_spec(), p);
  std::vector<int64_t> shapes;
  for (int v = 0; v < 5; ++v)
    shapes.insert(shapes.end(), {12, 10, 14});
  shapes[7] = 11;  // case 2, h = 11 > H = 10
  test::put_int64_dataset(p, "volume_shapes", {5, 3}, shapes);
  std::string m = test::open_error(p);
  EXPECT_NE(
      m.find("'/volume_shapes': case 2 has extent 11 on axis H, "
             "outside 1..10"),
      std::string::npos)
      << m;
  shapes[7] = 0;
  test::put_int64_dataset(p, "volume_shapes", {5, 3}, shapes);
  EXPECT_NE(test::open_error(p).find("extent 0"), std::string::npos);
  test::put_int64_dataset(p, "volume_shapes", {4, 3}, {});
  m = test::open_error(p);
  EXPECT_NE(m.find("expected [5, 3] integers"), std::string::npos) << m;
  // Whole shapes everywhere: not ragged, and read() reads rows again.
  shapes[7] = 10;
  test::put_int64_dataset(p, "volume_shapes", {5, 3}, shapes);
  const H5Dataset ds = H5Dataset::open(p, "t");
  EXPECT_FALSE(ds.info().ragged);
}

TEST(RaggedVolumes, InspectListsTheCases) {
  test::TempDir dir("ragged");
  make_synthetic(ragged_spec(), dir.file("r.h5"));
  const InspectReport r = inspect_file(dir.file("r.h5"));
  EXPECT_TRUE(r.ok) << r.text;
  EXPECT_NE(
      r.text.find("cases of different shapes: 5, from ["), std::string::npos)
      << r.text;
  EXPECT_NE(r.text.find("volume 0 [12, 10, 14]"), std::string::npos) << r.text;
}

}  // namespace
}  // namespace memtrain
