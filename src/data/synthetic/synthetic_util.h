#pragma once
// Private to make_synthetic's files (synthetic.cpp, synthetic_patches.cpp,
// synthetic_pairs.cpp, synthetic_captions.cpp, synthetic_regression.cpp):
// the Gaussian draws every kind uses, the split's seed and the atomic write.

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

#include "data/h5/h5_util.h"

namespace memtrain {

struct SyntheticSpec;

namespace synthetic {

// Box-Muller on our own uniform draws: std::normal_distribution is not the
// same across standard libraries, and these files must be.
class Gaussian {
 public:
  explicit Gaussian(std::seed_seq& seq) : rng_(seq) {}
  // The draws of (`seed`, `stream`): a task's fixed ones (a constant
  // stream) or a split's (hash_name of its name).
  Gaussian(uint64_t seed, uint32_t stream) {
    std::seed_seq seq{
        static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), stream};
    rng_.seed(seq);
  }
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double u1 = (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = r * std::sin(2.0 * M_PI * u2);
    has_spare_ = true;
    return r * std::cos(2.0 * M_PI * u2);
  }
  uint64_t raw() {
    return rng_();
  }

 private:
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// FNV-1a of a split's name: the sample draws' seed.
uint32_t hash_name(const std::string& s);

// Creates `path` atomically: `fill` writes the datasets into a temporary
// HDF5 file beside it, which is renamed over `path` when complete.
void write_file(
    const std::string& path, const std::function<void(hid_t)>& fill);

// A float32 [rows, width] dataset `name` of `f`, chunked by whole rows
// (about 64 Ki values a chunk).
void write_rows(
    hid_t f, const char* name, int64_t rows, int64_t width, const float* data);

// --kind pairs (synthetic_pairs.cpp): /features_a [N, F] and /features_b
// [N, Fb] sharing a latent vector per row.
void make_pairs(const SyntheticSpec& spec, const std::string& path);

// --kind captions (synthetic_captions.cpp): /images uint8 [N, 3, H, W] and
// /tokens int32 [N, 77] shaped like CLIP's, independent of each other.
void make_captions(const SyntheticSpec& spec, const std::string& path);

// --kind regression (synthetic_regression.cpp): /features [N, F] and
// /targets [N, T] linear in them.
void make_regression(const SyntheticSpec& spec, const std::string& path);

// --kind patch-features (synthetic_patches.cpp).
void make_patch_features(const SyntheticSpec& spec, const std::string& path);

}  // namespace synthetic
}  // namespace memtrain
