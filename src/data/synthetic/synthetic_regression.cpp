// make-data --kind regression: N rows of features x ~ N(0, I_F) and T
// targets y = W x + b + noise e, with W (T x F) drawn N(0, 1/F) and b
// N(0, 1) from the task seed (so a train and a val file of one seed share
// them), x and e from the seed and split. A linear model fits it down to
// the noise: the best RMSE is --noise.
#include <algorithm>
#include <cmath>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "data/synthetic/synthetic_util.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"

namespace memtrain::synthetic {

void make_regression(const SyntheticSpec& spec, const std::string& path) {
  const int64_t f = spec.features;
  const int64_t t = spec.targets;
  MT_CHECK(
      f > 0 && t > 0,
      "make-data --kind regression: --features and --targets must be "
      "positive");
  Gaussian task(spec.seed, 0x7e6u);
  const double s = 1.0 / std::sqrt(static_cast<double>(f));
  std::vector<double> w(t * f), b(t);
  for (double& v : w)
    v = s * task.next();
  for (double& v : b)
    v = task.next();
  Gaussian gen(spec.seed, hash_name(spec.split));
  const int64_t n = spec.samples;
  std::vector<float> x(n * f), y(n * t);
  for (int64_t i = 0; i < n; ++i) {
    float* xi = x.data() + i * f;
    for (int64_t j = 0; j < f; ++j)
      xi[j] = static_cast<float>(gen.next());
    for (int64_t k = 0; k < t; ++k) {
      double v = b[k] + spec.noise * gen.next();
      for (int64_t j = 0; j < f; ++j)
        v += w[k * f + j] * xi[j];
      y[i * t + k] = static_cast<float>(v);
    }
  }
  write_file(path, [&](hid_t file) {
    write_rows(file, layout::kFeatures, n, f, x.data());
    write_rows(file, layout::kTargets, n, t, y.data());
    h5::write_attr(file, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(file, layout::kKind, std::string("regression"));
    h5::write_attr(
        file, layout::kGenerator, std::string("memtrain make-data regression"));
    h5::write_attr(file, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(file, layout::kSplit, spec.split);
    h5::write_attr(file, layout::kNoise, spec.noise);
  });
}

}  // namespace memtrain::synthetic
