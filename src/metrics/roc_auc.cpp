#include "memtrain/metrics/roc_auc.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "memtrain/util/error.h"

namespace memtrain {

double roc_auc(
    const std::vector<double>& scores, const std::vector<int64_t>& labels) {
  MT_CHECK(
      scores.size() == labels.size(),
      "roc_auc: ",
      scores.size(),
      " scores but ",
      labels.size(),
      " labels");
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const size_t n = scores.size();
  double positives = 0;
  for (size_t i = 0; i < n; ++i) {
    if (std::isnan(scores[i]))
      return nan;
    positives += labels[i] != 0 ? 1 : 0;
  }
  const double negatives = static_cast<double>(n) - positives;
  if (positives == 0 || negatives == 0)
    return nan;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return scores[a] < scores[b];
  });
  // Ranks from 1; a run of equal scores shares the mean of its ranks.
  double rank_sum = 0;  // of the positives; half-integers, exact in double
  for (size_t i = 0; i < n;) {
    size_t j = i;
    double run_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      run_positives += labels[order[j]] != 0 ? 1 : 0;
      ++j;
    }
    const double mean_rank = (static_cast<double>(i + 1 + j)) / 2.0;
    rank_sum += run_positives * mean_rank;
    i = j;
  }
  return (rank_sum - positives * (positives + 1) / 2) / (positives * negatives);
}

}  // namespace memtrain
