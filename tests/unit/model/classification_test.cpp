// Classifiers of rows: the one loss (classification_loss) against torch's
// own functions and hand formulas -- binary cross-entropy of one logit,
// cross-entropy with label smoothing, timm's binary smoothing -- the
// predicted class, and the ROC AUC against hand-computed values, ties
// included (= sklearn's roc_auc_score), and NaN for one class.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "memtrain/metrics/roc_auc.h"
#include "memtrain/model/losses.h"

namespace memtrain {
namespace {

namespace F = torch::nn::functional;

double hand_bce_sum(const at::Tensor& z, const at::Tensor& t) {
  double sum = 0;
  for (int64_t i = 0; i < z.size(0); ++i) {
    const double x = z[i].item<double>(), y = t[i].item<double>();
    sum += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::abs(x)));
  }
  return sum;
}

TEST(Classification, BinaryLossIsBceWithLogitsSummed) {
  torch::manual_seed(1);
  const at::Tensor logits = torch::randn({9, 1}) * 3;
  const at::Tensor y = torch::randint(0, 2, {9}, torch::kInt64);
  ClassificationLoss how;
  how.binary = true;
  const at::Tensor got = classification_loss(logits, y, how);
  const at::Tensor want = F::binary_cross_entropy_with_logits(
      logits.squeeze(1),
      y.to(torch::kFloat32),
      F::BinaryCrossEntropyWithLogitsFuncOptions().reduction(torch::kSum));
  EXPECT_EQ(got.dim(), 0);
  EXPECT_EQ(got.item<float>(), want.item<float>());
  EXPECT_NEAR(
      got.item<double>(),
      hand_bce_sum(logits.squeeze(1), y.to(torch::kFloat64)),
      1e-5);
  const at::Tensor per = classification_loss(logits, y, how, true);
  ASSERT_EQ(per.sizes(), (std::vector<int64_t>{9}));
  EXPECT_NEAR(per.sum().item<double>(), got.item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(
      predicted_class(logits, true),
      logits.squeeze(1).gt(0).to(torch::kInt64)));
}

TEST(Classification, BinaryLabelSmoothingIsTimmsTarget) {
  torch::manual_seed(2);
  const at::Tensor logits = torch::randn({7, 1}) * 2;
  const at::Tensor y = torch::tensor({0, 1, 1, 0, 1, 0, 0}, torch::kInt64);
  ClassificationLoss how{true, 0.2};
  const at::Tensor t = y.to(torch::kFloat64) * 0.8 + 0.1;  // y (1 - s) + s / 2
  EXPECT_NEAR(
      classification_loss(logits, y, how).item<double>(),
      hand_bce_sum(logits.squeeze(1), t),
      1e-5);
}

TEST(Classification, CrossEntropyWithLabelSmoothingIsTorchs) {
  torch::manual_seed(3);
  const int64_t n = 8, K = 5;
  const at::Tensor logits = torch::randn({n, K}) * 2;
  const at::Tensor y = torch::randint(0, K, {n}, torch::kInt64);
  for (double s : {0.0, 0.1, 0.5}) {
    ClassificationLoss how{false, s};
    const double got = classification_loss(logits, y, how).item<double>();
    const double want =
        F::cross_entropy(
            logits,
            y,
            F::CrossEntropyFuncOptions().label_smoothing(s).reduction(
                torch::kSum))
            .item<double>();
    EXPECT_EQ(got, want) << s;
    // By hand: (1 - s) (-log p_y) + s / K sum_k (-log p_k), in double.
    const at::Tensor logp = torch::log_softmax(logits.to(torch::kFloat64), 1);
    double hand = 0;
    for (int64_t i = 0; i < n; ++i) {
      hand += -(1 - s) * logp[i][y[i].item<int64_t>()].item<double>() -
              s / K * logp[i].sum().item<double>();
    }
    EXPECT_NEAR(got, hand, 1e-5) << s;
    EXPECT_NEAR(
        classification_loss(logits, y, how, true).sum().item<double>(),
        got,
        1e-5);
  }
  EXPECT_TRUE(torch::equal(predicted_class(logits, false), logits.argmax(1)));
}

TEST(Classification, RocAucByHand) {
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.2, 0.3, 0.4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.2, 0.3, 0.4}, {1, 1, 0, 0}), 0.0);
  // Ties between a positive and a negative count a half:
  // (1 + 0.5 + 2) / 4.
  EXPECT_DOUBLE_EQ(roc_auc({0.1, 0.5, 0.5, 0.9}, {0, 0, 1, 1}), 0.875);
  EXPECT_DOUBLE_EQ(roc_auc({0.5, 0.5, 0.5, 0.5}, {0, 1, 0, 1}), 0.5);
  // sklearn.metrics.roc_auc_score([0, 0, 1, 1, 1], [1, 2, 2, 3, 2]) = 5/6.
  EXPECT_DOUBLE_EQ(roc_auc({1, 2, 2, 3, 2}, {0, 0, 1, 1, 1}), 5.0 / 6.0);
  // Order does not matter, only the scores' ranks.
  EXPECT_DOUBLE_EQ(roc_auc({2, 3, 1, 2, 2}, {1, 1, 0, 0, 1}), 5.0 / 6.0);
  EXPECT_TRUE(std::isnan(roc_auc({0.1, 0.2}, {1, 1})));
  EXPECT_TRUE(std::isnan(roc_auc({0.1, 0.2}, {0, 0})));
  EXPECT_TRUE(std::isnan(roc_auc({}, {})));
  EXPECT_TRUE(std::isnan(roc_auc({0.1, NAN}, {0, 1})));
}

TEST(Classification, RocAucIsThePairCount) {
  // Many ties (scores on a grid of 7 values): every (positive, negative)
  // pair, 1 when the positive scores higher, 1/2 when equal.
  torch::manual_seed(4);
  const int64_t n = 301;
  const at::Tensor s = torch::randint(0, 7, {n}, torch::kInt64);
  const at::Tensor y = torch::randint(0, 2, {n}, torch::kInt64);
  std::vector<double> scores(n);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) {
    scores[i] = s[i].item<double>() / 7.0;
    labels[i] = y[i].item<int64_t>();
  }
  double pairs = 0, credit = 0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      if (labels[i] != 1 || labels[j] != 0)
        continue;
      pairs += 1;
      credit += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0;
    }
  }
  EXPECT_NEAR(roc_auc(scores, labels), credit / pairs, 1e-12);
}

}  // namespace
}  // namespace memtrain
