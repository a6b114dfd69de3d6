#pragma once
// Private to src/data/: what the synthetic generators (synthetic.cpp,
// synthetic_pairs.cpp) share: a Gaussian stream that is the same with every
// standard library, a split name's hash, and the atomic HDF5 file writer.
#include <hdf5.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>

namespace memtrain {
namespace synth {

// Box-Muller on our own uniform draws: std::normal_distribution is not the
// same across standard libraries, and these files must be.
class Gaussian {
 public:
  explicit Gaussian(std::seed_seq& seq) : rng_(seq) {}
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

// FNV-1a of `s`: different split names draw different samples.
uint32_t hash_name(const std::string& s);

// Writes `path` atomically: `fill` writes a temporary HDF5 file in the same
// folder, which is flushed and renamed to `path` when complete (removed on
// an error). Throws memtrain::Error.
void write_file(
    const std::string& path, const std::function<void(hid_t)>& fill);

}  // namespace synth
}  // namespace memtrain
