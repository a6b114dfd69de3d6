#pragma once
// A counter-based random stream: the k-th draw of a key is a pure function
// of (key, k), so a sample's random choices depend on what identifies the
// sample (a seed, the epoch, its index) and never on the thread, the rank or
// the order in which samples are read. Used by PatchSampler (volume
// patches) and the image augmentation (input/image_augment.h). Also the
// seeded train/val split of the converters (convert-images,
// convert-dataset): split_key and val_count.

#include <cmath>
#include <cstdint>
#include <string>

namespace memtrain {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The key of sample `sample` of `epoch` under `seed`, for the stream named
// by `salt` (each user of a seed has its own salt, so that their draws are
// unrelated).
inline uint64_t sample_key(
    uint64_t seed, uint64_t salt, int64_t epoch, int64_t sample) {
  return splitmix64(
      splitmix64(seed ^ salt) ^
      splitmix64(uint64_t(epoch) * 0x2545f4914f6cdd1dULL + uint64_t(sample)));
}

// Draw k of a key.
struct CounterDraws {
  uint64_t key;
  uint64_t next(uint64_t k) const {
    return splitmix64(key ^ splitmix64(k + 0x632be59bd9b4e019ULL));
  }
  // Uniform in [0, n).
  int64_t below(uint64_t k, int64_t n) const {
    return n <= 1 ? 0 : static_cast<int64_t>(next(k) % uint64_t(n));
  }
  // Uniform in [0, 1), 53 bits.
  double unit(uint64_t k) const {
    return static_cast<double>(next(k) >> 11) * (1.0 / 9007199254740992.0);
  }
};

// FNV-1a, 64 bits, over the bytes of `s`.
inline uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : s)
    h = (h ^ c) * 1099511628211ull;
  return h;
}

// The split rule of the converters (docs/data-format.md "From an image
// folder"): an item named `name` (convert-images: the image's path inside its
// class folder, '/'-separated; convert-dataset: the case name) has the key
// SplitMix64(FNV-1a-64(name) XOR SplitMix64(seed)); of n items the
// val_count(n, fraction) = floor(fraction * n + 0.5) with the smallest keys
// (ties: by name) go to validation.
inline uint64_t split_key(const std::string& name, uint64_t seed) {
  return splitmix64(fnv1a64(name) ^ splitmix64(seed));
}
inline int64_t val_count(int64_t n, double fraction) {
  return static_cast<int64_t>(std::floor(fraction * n + 0.5));
}

}  // namespace memtrain
