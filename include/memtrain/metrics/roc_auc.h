#pragma once
// The area under the ROC curve of a binary classifier's validation scores.
// No LibTorch.

#include <cstdint>
#include <vector>

namespace memtrain {

// ROC AUC of `scores` (any monotone score: logits or probabilities) against
// `labels` (0 or 1): the Mann-Whitney statistic
//   (sum of the positives' ranks - n1 (n1 + 1) / 2) / (n1 n0),
// with tied scores given their average rank (a tie between a positive and a
// negative counts a half), which is exactly sklearn.metrics.roc_auc_score.
// NaN when the labels hold one class only (AUC is undefined) or a score is
// NaN. Throws memtrain::Error when the sizes differ.
double roc_auc(
    const std::vector<double>& scores, const std::vector<int64_t>& labels);

}  // namespace memtrain
