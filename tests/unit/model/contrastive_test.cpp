// The contrastive pieces: the symmetric InfoNCE against a hand computation
// (with and without pair ids), the dual encoder's names, outputs and logit
// scale, and pair files (make-data --kind pairs and captions, /pair_ids,
// checks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/dual_encoder.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

// l_i = (-log softmax_j(L_i.)_i - log softmax_j(L_.i)_i) / 2 with the
// entries j != i of the same id left out; loops in double.
std::vector<double> hand_losses(
    const torch::Tensor& emb, double t, const std::vector<int64_t>& ids) {
  const int64_t n = emb.size(0);
  const auto e = emb.to(torch::kFloat64).contiguous();
  const auto L = [&](int64_t i, int64_t j) {
    double dot = 0;
    for (int64_t k = 0; k < e.size(2); ++k)
      dot += e[i][0][k].item<double>() * e[j][1][k].item<double>();
    return std::exp(t) * dot;
  };
  std::vector<double> out(n);
  for (int64_t i = 0; i < n; ++i) {
    double row = 0, col = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (j != i && ids[j] == ids[i])
        continue;
      row += std::exp(L(i, j));
      col += std::exp(L(j, i));
    }
    out[i] = 0.5 * ((std::log(row) - L(i, i)) + (std::log(col) - L(i, i)));
  }
  return out;
}

TEST(Contrastive, SymmetricInfoNceIsTheHandComputation) {
  torch::manual_seed(3);
  auto emb = torch::randn({5, 2, 4});
  emb = emb / emb.norm(2, 2, true);
  const double t = std::log(1 / 0.07);
  for (const std::vector<int64_t>& ids :
       {std::vector<int64_t>{0, 1, 2, 3, 4},
        std::vector<int64_t>{0, 0, 1, 2, 2}}) {
    const auto got = contrastive_losses(
        emb, torch::full({}, t), torch::tensor(ids, torch::kInt64));
    const auto want = hand_losses(emb, t, ids);
    ASSERT_EQ(got.size(0), 5);
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR(got[i].item<double>(), want[i], 1e-5) << "row " << i;
  }
  // Shared ids change the loss (fewer negatives).
  const auto a = contrastive_losses(
      emb, torch::full({}, t), torch::arange(5, torch::kInt64));
  const auto b = contrastive_losses(
      emb,
      torch::full({}, t),
      torch::tensor(std::vector<int64_t>{0, 0, 1, 2, 2}, torch::kInt64));
  EXPECT_GT((a - b).abs().max().item<double>(), 1e-3);
  EXPECT_THROW(
      contrastive_losses(
          emb, torch::full({}, t), torch::arange(4, torch::kInt64)),
      Error);
}

TEST(Contrastive, DualEncoderNamesOutputsAndLogitScale) {
  ModelConfig cfg;
  cfg.name = ModelName::kDualEncoder;
  cfg.hidden = 8;
  cfg.depth = 2;
  cfg.embed_dim = 6;
  const ModelInput features{SampleKind::kFeatures, {5}, 0, 3};
  auto m = make_dual_encoder(cfg, features);
  const auto params = m->named_parameters();
  for (const char* name :
       {"tower_a.input.weight",
        "tower_a.blocks.1.fc2.bias",
        "tower_a.head.weight",
        "tower_b.input.weight",
        "tower_b.head.bias",
        "logit_scale"})
    EXPECT_TRUE(params.contains(name)) << name;
  EXPECT_EQ(
      params["tower_a.input.weight"].sizes(), (std::vector<int64_t>{8, 5}));
  EXPECT_EQ(
      params["tower_b.input.weight"].sizes(), (std::vector<int64_t>{8, 3}));
  EXPECT_EQ(
      params["tower_b.head.weight"].sizes(), (std::vector<int64_t>{6, 8}));
  EXPECT_NEAR(m->logit_scale().item<double>(), std::log(1 / 0.07), 1e-6);
  EXPECT_EQ(m->num_segments(), 4);
  EXPECT_EQ(m->segment_names()[2], "tower_b.blocks.0");

  const auto z = m->forward(torch::randn({7, 5}), torch::randn({7, 3}));
  EXPECT_EQ(z.sizes(), (std::vector<int64_t>{7, 2, 6}));
  EXPECT_LT((z.norm(2, 2) - 1).abs().max().item<double>(), 1e-5);
  // Checkpointing every segment: the same embeddings.
  m->set_checkpointed(4);
  torch::manual_seed(0);
  const auto x = torch::randn({7, 5}), c = torch::randn({7, 3});
  const auto z1 = m->forward(x, c);
  m->set_checkpointed(0);
  EXPECT_TRUE(torch::allclose(z1, m->forward(x, c)));

  // CLIP's clamp: [0, log 100].
  {
    torch::NoGradGuard no_grad;
    m->logit_scale().fill_(9.0);
  }
  m->clamp_logit_scale();
  EXPECT_NEAR(m->logit_scale().item<double>(), std::log(100.0), 1e-6);

  // Tower a is the CNN on images.
  const ModelInput images{SampleKind::kImages, {3, 8, 8}, 0, 4};
  auto im = make_dual_encoder(cfg, images);
  EXPECT_TRUE(im->named_parameters().contains("tower_a.stem.weight"));
  EXPECT_EQ(
      im->forward(torch::randn({2, 3, 8, 8}), torch::randn({2, 4})).sizes(),
      (std::vector<int64_t>{2, 2, 6}));
}

TEST(Contrastive, PairFilesReadAndCheck) {
  test::TempDir dir("pairs");
  SyntheticSpec spec;
  spec.kind = "pairs";
  spec.samples = 30;
  spec.features = 6;
  spec.context = 4;
  make_synthetic(spec, dir.file("p.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("p.h5"), "data.train");
  const DatasetInfo& info = ds.info();
  EXPECT_TRUE(info.paired);
  EXPECT_EQ(info.kind, SampleKind::kFeatures);
  EXPECT_EQ(info.sample_dataset, "/features_a");
  EXPECT_EQ(info.sample_shape, std::vector<int64_t>{6});
  EXPECT_EQ(info.context_features, 4);
  EXPECT_EQ(info.num_classes, 0);
  EXPECT_TRUE(info.row_labels.empty());
  EXPECT_TRUE(info.checksummed);
  // No /pair_ids: the label of a row is its index; b comes as `context`.
  std::vector<float> a(2 * 6), b(2 * 4), b1(4);
  std::vector<int64_t> y(2), y1(1);
  ds.read({12, 3}, a.data(), y.data(), b.data());
  EXPECT_EQ(y, (std::vector<int64_t>{12, 3}));
  ds.read({3}, a.data(), y1.data(), b1.data());
  EXPECT_EQ(std::vector<float>(b.begin() + 4, b.end()), b1);
  // The same seed and split: the same pairs.
  make_synthetic(spec, dir.file("q.h5"));
  std::vector<float> a2(6), b2(4);
  std::vector<int64_t> y2(1);
  H5Dataset::open(dir.file("q.h5"), "t")
      .read({3}, a2.data(), y2.data(), b2.data());
  EXPECT_EQ(b2, b1);
}

// make-data --kind captions: a pair file of uint8 images and CLIP-shaped
// tokens that opens as model.name: clip's input, the same for one seed and
// split.
TEST(Contrastive, SyntheticCaptionsAreClipPairs) {
  test::TempDir dir("captions");
  SyntheticSpec spec;
  spec.kind = "captions";
  spec.samples = 40;
  spec.height = 8;
  spec.width = 12;
  spec.seed = 3;
  make_synthetic(spec, dir.file("c.h5"));
  const H5Dataset ds = H5Dataset::open(dir.file("c.h5"), "data.train");
  const DatasetInfo& info = ds.info();
  EXPECT_TRUE(info.paired);
  EXPECT_TRUE(info.tokens);
  EXPECT_EQ(info.kind, SampleKind::kImages);
  EXPECT_EQ(info.sample_dataset, "/images");
  EXPECT_EQ(info.sample_dtype, "uint8");
  EXPECT_EQ(info.num_samples, 40);
  EXPECT_EQ(info.sample_shape, (std::vector<int64_t>{3, 8, 12}));
  EXPECT_EQ(info.context_features, 77);
  EXPECT_EQ(info.token_vocab, 49408);
  EXPECT_LT(info.token_max, 49408);
  EXPECT_EQ(info.token_max, 49407);  // every row has the end token
  EXPECT_TRUE(info.checksummed);
  std::vector<float> x(2 * 3 * 8 * 12), t(2 * 77);
  std::vector<int64_t> y(2);
  ds.read({0, 39}, x.data(), y.data(), t.data());
  for (float v : x) {
    EXPECT_GE(v, 0.0f);  // uint8 / 255
    EXPECT_LE(v, 1.0f);
  }
  for (int r = 0; r < 2; ++r) {
    const float* row = t.data() + r * 77;
    EXPECT_EQ(row[0], 49406.0f);
    int end = 1;
    while (end < 77 && row[end] != 49407.0f) {
      EXPECT_GE(row[end], 0.0f);
      EXPECT_LT(row[end], 49406.0f);
      ++end;
    }
    ASSERT_LT(end, 77);  // 1..75 ids, then the end token
    EXPECT_GE(end, 2);
    for (int k = end + 1; k < 77; ++k)
      EXPECT_EQ(row[k], 0.0f);
  }
  // The same seed and split: the same file contents.
  make_synthetic(spec, dir.file("d.h5"));
  std::vector<float> x2(x.size()), t2(t.size());
  H5Dataset::open(dir.file("d.h5"), "t")
      .read({0, 39}, x2.data(), y.data(), t2.data());
  EXPECT_EQ(x2, x);
  EXPECT_EQ(t2, t);
}

}  // namespace
}  // namespace memtrain
