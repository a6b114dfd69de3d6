#include "memtrain/metrics/seg_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One axis of the transform: f (n values, stride apart from base) becomes
// min_q f(q) + (s (p - q))^2 (Felzenszwalb and Huttenlocher, "Distance
// Transforms of Sampled Functions", 2012), the parabolas of finite f only.
void transform_line(
    double* f,
    int64_t n,
    int64_t stride,
    double s,
    std::vector<double>& d,
    std::vector<int64_t>& v,
    std::vector<double>& z) {
  d.resize(n);
  v.resize(n);
  z.resize(n + 1);
  int64_t k = -1;
  auto meet = [&](int64_t q, int64_t r) {  // where parabolas q and r meet
    const double xq = q * s, xr = r * s;
    return ((f[q * stride] + xq * xq) - (f[r * stride] + xr * xr)) /
           (2 * (xq - xr));
  };
  for (int64_t q = 0; q < n; ++q) {
    if (!std::isfinite(f[q * stride]))
      continue;
    if (k < 0) {
      v[0] = q;
      z[0] = -kInf;
      z[1] = kInf;
      k = 0;
      continue;
    }
    double m = meet(q, v[k]);
    while (k > 0 && m <= z[k]) {
      --k;
      m = meet(q, v[k]);
    }
    ++k;
    v[k] = q;
    z[k] = m;
    z[k + 1] = kInf;
  }
  if (k < 0)
    return;  // no finite value on this line: it stays +inf
  int64_t j = 0;
  for (int64_t p = 0; p < n; ++p) {
    while (z[j + 1] < p * s)
      ++j;
    const double dx = (p - v[j]) * s;
    d[p] = dx * dx + f[v[j] * stride];
  }
  for (int64_t p = 0; p < n; ++p)
    f[p * stride] = d[p];
}

// Voxels of `m` (0/1) with a 6-neighbour outside it or on the border.
std::vector<uint8_t> surface(
    const std::vector<uint8_t>& m, const std::array<int64_t, 3>& n) {
  std::vector<uint8_t> s(m.size(), 0);
  const int64_t D = n[0], H = n[1], W = n[2];
  for (int64_t z = 0; z < D; ++z)
    for (int64_t y = 0; y < H; ++y)
      for (int64_t x = 0; x < W; ++x) {
        const int64_t i = (z * H + y) * W + x;
        if (!m[i])
          continue;
        const bool edge = z == 0 || z == D - 1 || y == 0 || y == H - 1 ||
                          x == 0 || x == W - 1 || !m[i - H * W] ||
                          !m[i + H * W] || !m[i - W] || !m[i + W] ||
                          !m[i - 1] || !m[i + 1];
        s[i] = edge;
      }
  return s;
}

// numpy.percentile(values, p) with linear interpolation.
double percentile(std::vector<double> values, double p) {
  MT_INTERNAL_ASSERT(!values.empty());
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - lo);
}

// 95th percentile of the distances from surface `from` to surface `to`.
double directed_hd95(
    const std::vector<uint8_t>& from,
    const std::vector<uint8_t>& to,
    const std::array<int64_t, 3>& n,
    const std::array<double, 3>& spacing) {
  const std::vector<double> d2 = squared_distance_transform(to, n, spacing);
  std::vector<double> d;
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i])
      d.push_back(std::sqrt(d2[i]));
  }
  return percentile(std::move(d), 95.0);
}

}  // namespace

std::vector<double> squared_distance_transform(
    const std::vector<uint8_t>& feature,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing_mm) {
  const int64_t D = dims[0], H = dims[1], W = dims[2];
  MT_INTERNAL_ASSERT(static_cast<int64_t>(feature.size()) == D * H * W);
  std::vector<double> f(feature.size());
  for (size_t i = 0; i < f.size(); ++i)
    f[i] = feature[i] ? 0.0 : kInf;
  std::vector<double> d, z;
  std::vector<int64_t> v;
  for (int64_t a = 0; a < D * H; ++a)  // along W
    transform_line(f.data() + a * W, W, 1, spacing_mm[2], d, v, z);
  for (int64_t zz = 0; zz < D; ++zz)  // along H
    for (int64_t x = 0; x < W; ++x)
      transform_line(f.data() + zz * H * W + x, H, W, spacing_mm[1], d, v, z);
  for (int64_t a = 0; a < H * W; ++a)  // along D
    transform_line(f.data() + a, D, H * W, spacing_mm[0], d, v, z);
  return f;
}

double hard_dice(const DiceCounts& c, bool ignore_empty) {
  MT_INTERNAL_ASSERT(
      c.both >= 0 && c.both <= c.pred && c.both <= c.truth,
      "both ",
      c.both,
      " pred ",
      c.pred,
      " truth ",
      c.truth);
  if (c.truth == 0) {
    if (ignore_empty)
      return std::numeric_limits<double>::quiet_NaN();
    return c.pred == 0 ? 1.0 : 0.0;
  }
  return 2.0 * static_cast<double>(c.both) /
         static_cast<double>(c.pred + c.truth);
}

std::vector<DiceCounts> dice_counts_of(const double* triples, int64_t k) {
  std::vector<DiceCounts> n(k);
  for (int64_t c = 0; c < k; ++c) {
    n[c] = {
        std::llround(triples[3 * c]),
        std::llround(triples[3 * c + 1]),
        std::llround(triples[3 * c + 2])};
  }
  return n;
}

DiceTable::DiceTable(int64_t num_classes, DiceRule rule)
    : k_(num_classes), rule_(rule) {
  MT_INTERNAL_ASSERT(num_classes >= 1);
}

void DiceTable::add(std::string name, const std::vector<DiceCounts>& counts) {
  MT_INTERNAL_ASSERT(static_cast<int64_t>(counts.size()) == k_);
  names_.push_back(std::move(name));
  for (const DiceCounts& c : counts) {
    counts_.push_back(c);
    dice_.push_back(hard_dice(c, rule_.ignore_empty));
  }
}

namespace {

double nan_mean(double sum, int64_t n) {
  return n > 0 ? sum / static_cast<double>(n)
               : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

double DiceTable::case_mean(size_t i) const {
  double sum = 0.0;
  int64_t n = 0;
  for (int64_t c = first_class(); c < k_; ++c) {
    if (!std::isnan(dice(i, c))) {
      sum += dice(i, c);
      ++n;
    }
  }
  return nan_mean(sum, n);
}

double DiceTable::class_mean(int64_t c) const {
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < num_cases(); ++i) {
    if (!std::isnan(dice(i, c))) {
      sum += dice(i, c);
      ++n;
    }
  }
  return nan_mean(sum, n);
}

double DiceTable::mean() const {
  double sum = 0.0;
  int64_t n = 0;
  for (size_t i = 0; i < num_cases(); ++i) {
    const double d = case_mean(i);
    if (!std::isnan(d)) {
      sum += d;
      ++n;
    }
  }
  return nan_mean(sum, n);
}

std::vector<ClassMetrics> segmentation_metrics(
    const std::vector<uint8_t>& pred,
    const std::vector<uint8_t>& truth,
    const std::array<int64_t, 3>& dims,
    const std::array<double, 3>& spacing_mm,
    int64_t num_classes,
    const DiceRule& rule) {
  MT_INTERNAL_ASSERT(pred.size() == truth.size());
  std::vector<ClassMetrics> out;
  for (int64_t c = rule.include_background ? 0 : 1; c < num_classes; ++c) {
    ClassMetrics m;
    m.cls = c;
    std::vector<uint8_t> p(pred.size()), t(truth.size());
    int64_t both = 0;
    for (size_t i = 0; i < pred.size(); ++i) {
      p[i] = pred[i] == c;
      t[i] = truth[i] == c;
      m.pred_voxels += p[i];
      m.true_voxels += t[i];
      both += p[i] & t[i];
    }
    m.dice = hard_dice({both, m.pred_voxels, m.true_voxels}, rule.ignore_empty);
    if (m.pred_voxels + m.true_voxels == 0) {
      m.hd95_mm = 0.0;
    } else if (m.pred_voxels == 0 || m.true_voxels == 0) {
      m.hd95_mm = kInf;
    } else {
      const auto sp = surface(p, dims), st = surface(t, dims);
      m.hd95_mm = std::max(
          directed_hd95(sp, st, dims, spacing_mm),
          directed_hd95(st, sp, dims, spacing_mm));
    }
    out.push_back(m);
  }
  return out;
}

}  // namespace memtrain
