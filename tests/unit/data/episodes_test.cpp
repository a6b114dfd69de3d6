#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <set>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/episodes.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

// 10 classes; class c has 5 + c rows, interleaved.
ClassRows small_rows() {
  std::vector<int64_t> labels;
  for (int64_t c = 0; c < 10; ++c) {
    for (int64_t k = 0; k < 5 + c; ++k)
      labels.push_back(c);
  }
  std::reverse(labels.begin(), labels.end());
  return ClassRows::from_labels(labels, 10, {});
}

using test::error_of;

TEST(Episodes, DependOnSeedEpochAndIndexAlone) {
  const ClassRows rows = small_rows();
  const EpisodeShape shape{3, 2, 2};
  const std::vector<int64_t> classes = {0, 2, 3, 5, 6, 8, 9};
  EpisodeSampler a(rows, classes, shape, 7, 0);
  // Another object, built later, asked in another order: same episodes.
  EpisodeSampler b(rows, {9, 8, 6, 5, 3, 2, 0}, shape, 7, 0);
  for (int64_t i = 5; i >= 0; --i)
    EXPECT_EQ(a.rows(2, i), b.rows(2, i)) << "episode " << i;
  EXPECT_EQ(a.rows(2, 1), a.rows(2, 1));
  EXPECT_NE(a.rows(2, 1), a.rows(2, 2)) << "indices must differ";
  EXPECT_NE(a.rows(2, 1), a.rows(3, 1)) << "epochs must differ";
  EpisodeSampler c(rows, classes, shape, 8, 0);
  EXPECT_NE(a.rows(2, 1), c.rows(2, 1)) << "seeds must differ";
  EpisodeSampler v(rows, classes, shape, 7, 1);
  EXPECT_NE(a.rows(2, 1), v.rows(2, 1)) << "streams must differ";
}

// The documented rule (Note [Episodes]), pinned: the Python reference in
// tests/peers/fewshot_reference.py re-draws episodes with it.
// The values come from the rule's Python form in fewshot_reference.py.
TEST(Episodes, RngIsTheDocumentedSplitMix64) {
  EXPECT_EQ(EpisodeRng(0, 0, 0, 0).next(), 0x78ae5a9a6b5fd45eull);
  EXPECT_EQ(EpisodeRng(3, 0, 1, 2).next(), 0xbeb6d03b8e294abeull);
  EpisodeRng r(3, 0, 1, 2);
  for (int i = 0; i < 1000; ++i)
    EXPECT_LT(r.below(7), 7u);
  EpisodeRng d(1, 2, 3, 4);
  EXPECT_EQ(
      draw_distinct({10, 11, 12, 13, 14}, 5, d),
      (std::vector<int64_t>{11, 12, 14, 13, 10}));
}

TEST(Episodes, RowsAreNWayDistinctClassesWithDistinctRows) {
  const ClassRows rows = small_rows();
  const EpisodeShape shape{4, 2, 3};
  std::vector<int64_t> label_of(rows.rows.size() * 20, -1);
  for (size_t c = 0; c < rows.rows.size(); ++c) {
    for (int64_t r : rows.rows[c])
      label_of[r] = static_cast<int64_t>(c);
  }
  const std::vector<int64_t> classes = {1, 2, 4, 5, 7, 9};
  EpisodeSampler s(rows, classes, shape, 3, 0);
  for (int64_t i = 0; i < 50; ++i) {
    const auto r = s.rows(0, i);
    const auto cls = s.episode_classes(0, i);
    ASSERT_EQ(static_cast<int64_t>(r.size()), shape.rows());
    ASSERT_EQ(static_cast<int64_t>(cls.size()), shape.n_way);
    EXPECT_EQ(std::set<int64_t>(cls.begin(), cls.end()).size(), 4u);
    EXPECT_EQ(std::set<int64_t>(r.begin(), r.end()).size(), r.size())
        << "rows of an episode are distinct";
    for (int64_t p = 0; p < shape.rows(); ++p) {
      const int64_t c = cls[shape.label_at(p)];
      EXPECT_EQ(label_of[r[p]], c) << "row " << p << " of episode " << i;
      EXPECT_TRUE(std::count(classes.begin(), classes.end(), c));
    }
  }
}

TEST(Episodes, ClassSplitIsDisjointAndChecked) {
  const ClassRows rows = small_rows();
  const EpisodeShape shape{3, 1, 4};  // needs 5 rows a class
  const ClassSplit listed =
      split_classes(rows, {7, 2, 9}, 0, 1, shape, true, "f.h5");
  EXPECT_EQ(listed.val, (std::vector<int64_t>{2, 7, 9}));
  EXPECT_EQ(listed.train, (std::vector<int64_t>{0, 1, 3, 4, 5, 6, 8}));
  const ClassSplit drawn = split_classes(rows, {}, 0.3, 5, shape, true, "f");
  EXPECT_EQ(drawn.val.size(), 3u);
  EXPECT_EQ(drawn.train.size(), 7u);
  std::vector<int64_t> both;
  std::set_intersection(
      drawn.val.begin(),
      drawn.val.end(),
      drawn.train.begin(),
      drawn.train.end(),
      std::back_inserter(both));
  EXPECT_TRUE(both.empty());
  EXPECT_EQ(drawn.val, split_classes(rows, {}, 0.3, 5, shape, true, "f").val)
      << "the fraction's draw depends on the seed alone";
  EXPECT_NE(drawn.val, split_classes(rows, {}, 0.3, 6, shape, true, "f").val);

  EXPECT_NE(
      error_of([&] {
        split_classes(rows, {2, 2}, 0, 1, shape, true, "f");
      }).find("listed twice"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        split_classes(rows, {10}, 0, 1, shape, true, "f");
      }).find("class 10 is not a class"),
      std::string::npos);
  EXPECT_NE(
      error_of([&] {
        split_classes(rows, {1, 2}, 0, 1, shape, true, "f");
      }).find("only 2 validation class(es)"),
      std::string::npos);
}

TEST(Episodes, ATooSmallClassIsNamedAndRefused) {
  const ClassRows rows = small_rows();  // class 0 has 5 rows, class 1 six
  const std::string e = error_of([&] {
    split_classes(rows, {7, 8, 9}, 0, 1, {3, 2, 4}, true, "f.h5");
  });
  EXPECT_NE(
      e.find("f.h5: class 0 (a training class) has 5 sample(s)"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("= 6 that an episode takes"), std::string::npos) << e;
  // The same class in the validation set, with validation off: not needed.
  EXPECT_EQ(
      error_of([&] {
        split_classes(rows, {0, 1, 9}, 0, 1, {3, 2, 4}, false, "f.h5");
      }),
      "");
}

TEST(Episodes, MakeDataFewshotIsBalancedAndOpens) {
  test::TempDir dir("episodes");
  SyntheticSpec spec;
  spec.kind = "fewshot";
  spec.classes = 12;
  spec.samples = 12 * 7;
  spec.features = 16;
  make_synthetic(spec, dir.file("fs.h5"));
  const H5Dataset data = H5Dataset::open(dir.file("fs.h5"), "data.train");
  const DatasetInfo& info = data.info();
  EXPECT_EQ(info.kind, SampleKind::kFeatures);
  EXPECT_EQ(info.num_classes, 12);
  EXPECT_EQ(info.num_samples, 84);
  ASSERT_EQ(info.row_labels.size(), 84u);
  for (int64_t c = 0; c < 12; ++c)
    EXPECT_EQ(info.label_counts[c], 7);
  const ClassRows rows =
      ClassRows::from_labels(info.row_labels, 12, info.class_names);
  const ClassSplit split =
      split_classes(rows, {}, 0.25, 0, {3, 1, 6}, true, "");
  EXPECT_EQ(split.val.size(), 3u);
}

TEST(Episodes, ConfigKeysNestAndRoundTrip) {
  test::TempDir dir("episodes_cfg");
  {
    std::ofstream y(dir.file("c.yaml"));
    y << "model: {head: cosine}\n"
         "data:\n  episodes: {n_way: 5, k_shot: 1, n_query: 15}\n"
         "  val_classes: [3, 1, 4]\n";
  }
  TrainConfig c =
      TrainConfig::load(dir.file("c.yaml"), {"data.episodes.k_shot=5"});
  EXPECT_EQ(c.data.episodes.n_way, 5);
  EXPECT_EQ(c.data.episodes.k_shot, 5);
  EXPECT_EQ(c.data.episodes.n_query, 15);
  EXPECT_EQ(c.data.val_classes.ids, (std::vector<int64_t>{3, 1, 4}));
  c.set("data.val_classes=0.25");
  EXPECT_TRUE(c.data.val_classes.ids.empty());
  EXPECT_DOUBLE_EQ(c.data.val_classes.fraction, 0.25);
  {
    std::ofstream y(dir.file("r.yaml"));
    y << c.to_yaml();
  }
  const TrainConfig back = TrainConfig::load(dir.file("r.yaml"), {});
  EXPECT_EQ(back.to_yaml(), c.to_yaml());
  EXPECT_NE(c.to_yaml().find("  episodes:\n    n_way: 5\n"), std::string::npos);
  EXPECT_NE(
      error_of([] {
        TrainConfig::load("", {"data.episodes.n_way=5"});
      }).find("few-shot head"),
      std::string::npos);
  EXPECT_NE(
      error_of([] {
        TrainConfig::load("", {"data.val_classes=1.5"});
      }).find("out of range"),
      std::string::npos);
}

}  // namespace
}  // namespace memtrain
