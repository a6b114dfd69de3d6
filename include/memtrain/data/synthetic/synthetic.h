#pragma once
// Synthetic datasets with a learnable signal, for the quick start, tests and
// benchmarks (captions excepted: random images and CLIP-shaped token rows
// that do not match, for measuring memory and time). Deterministic: the task
// (class centres / templates) comes from `seed`, the samples from `seed` and
// `split`, so a train and a val file made with the same seed share one task.

#include <cstdint>
#include <string>

namespace memtrain {

struct SyntheticSpec {
  // features | images | volumes | fewshot | pairs | captions |
  // patch-features | regression
  std::string kind = "features";
  int64_t samples = 4096;
  int64_t classes = 4;
  int64_t features = 32;  // features: F
  int64_t channels = 3;   // images: C, H, W (captions: H, W; C is 3)
  int64_t height = 16;
  int64_t width = 16;
  int64_t depth = 32;   // volumes: C, D, H, W
  int64_t context = 0;  // features: F2 of /context_features (0: none);
                        // pairs: Fb of /features_b (0: --features)
  int64_t latent = 16;  // pairs: dimensions the two elements share
  int64_t targets = 2;  // regression: T of /targets
  int64_t chunk = 16;   // volumes: chunk edge in voxels (0: a whole volume)
  // volumes: case n (n > 0) spans 50-100% of D, H, W on each axis, drawn
  // from the seed and split; /volume_shapes says how much (docs/data-format.md,
  // "Cases of different shapes"). The rest of its row is 0, never read.
  bool ragged = false;
  std::string dtype = "float32";  // images: float32 | uint8; volumes: +int16
  double noise = 1.0;  // noise standard deviation (centres: N(0, 0.5^2))
  uint64_t seed = 0;
  std::string split = "train";  // any name; different names, other samples
  // patch-features (docs/data-format.md, "Rows that belong to volumes"):
  // `volumes` grids of grid^3 rows each; rows in a seeded random order
  // instead of volume by volume with `shuffle`.
  int64_t volumes = 8;
  int64_t grid = 8;
  bool shuffle = false;
};

// Writes an HDF5 file in memtrain's layout (docs/data-format.md) to `path`,
// atomically: a temporary file in the same folder, renamed when complete.
// Throws memtrain::Error on a bad spec or an I/O failure.
void make_synthetic(const SyntheticSpec& spec, const std::string& path);

}  // namespace memtrain
