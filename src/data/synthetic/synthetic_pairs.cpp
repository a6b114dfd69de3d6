// make-data --kind pairs: N pairs (a, b) of feature vectors that share a
// latent vector, as precomputed image and text embeddings of one item do:
//   z ~ N(0, I_L), a = A z + noise e_a, b = B z + noise e_b,
// with A (Fa x L) and B (Fb x L) drawn N(0, 1/L) from the task seed (so a
// train and a val file of one seed share them), z and the noise from the
// seed and split. Tower a can learn to map a to z and tower b b to z: the
// correspondence is learnable, and row i of /features_a matches row i of
// /features_b only.
#include <algorithm>
#include <cmath>
#include <vector>

#include "data/h5/h5_util.h"
#include "data/h5/layout.h"
#include "data/synthetic/synthetic_util.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/util/error.h"

namespace memtrain::synthetic {

void make_pairs(const SyntheticSpec& spec, const std::string& path) {
  const int64_t fa = spec.features;
  const int64_t fb = spec.context > 0 ? spec.context : spec.features;
  const int64_t latent = spec.latent;
  MT_CHECK(
      fa > 0 && latent > 0,
      "make-data --kind pairs: --features and --latent must be positive");
  Gaussian task(spec.seed, 0x9a1u);
  const double s = 1.0 / std::sqrt(static_cast<double>(latent));
  std::vector<double> a(fa * latent), b(fb * latent);
  for (double& v : a)
    v = s * task.next();
  for (double& v : b)
    v = s * task.next();
  Gaussian gen(spec.seed, hash_name(spec.split));
  const int64_t n = spec.samples;
  std::vector<float> xa(n * fa), xb(n * fb);
  std::vector<double> z(latent);
  const auto project =
      [&](const std::vector<double>& m, int64_t f, float* out) {
        for (int64_t j = 0; j < f; ++j) {
          double v = spec.noise * gen.next();
          for (int64_t k = 0; k < latent; ++k)
            v += m[j * latent + k] * z[k];
          out[j] = static_cast<float>(v);
        }
      };
  for (int64_t i = 0; i < n; ++i) {
    for (double& v : z)
      v = gen.next();
    project(a, fa, xa.data() + i * fa);
    project(b, fb, xb.data() + i * fb);
  }
  write_file(path, [&](hid_t f) {
    write_rows(f, layout::kFeaturesA, n, fa, xa.data());
    write_rows(f, layout::kFeaturesB, n, fb, xb.data());
    h5::write_attr(f, layout::kLayoutVersion, layout::kVersion);
    h5::write_attr(f, layout::kKind, std::string("pairs"));
    h5::write_attr(
        f, layout::kGenerator, std::string("memtrain make-data pairs"));
    h5::write_attr(f, layout::kSeed, static_cast<int64_t>(spec.seed));
    h5::write_attr(f, layout::kSplit, spec.split);
    h5::write_attr(f, layout::kNoise, spec.noise);
    h5::write_attr(f, layout::kLatent, latent);
  });
}

}  // namespace memtrain::synthetic
