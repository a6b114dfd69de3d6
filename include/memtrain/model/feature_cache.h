#pragma once
// model.feature_cache=host: what a frozen extraction computed from a 2D
// slice, kept in host memory so that later epochs copy it back instead of
// computing it again (dinov3's backbone; Note [The feature cache] in
// feature_cache.cpp). Keyed by where the slice was cut from: the sample
// origins (below) that the patch reader and the sliding window give, so
// nothing is hashed and no device value is read on the host.

#include <ATen/core/Tensor.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace memtrain {

// Where the samples of a batch were cut from: Batch::origin and the
// sliding window's windows, (n, kOriginColumns) int64, host memory.
enum OriginColumn : int64_t {
  kOriginSet = 0,      // kTrainOrigin or kValOrigin: which file
  kOriginVolume = 1,   // the volume (case) in that file
  kOriginCorner = 2,   // 3 columns: the patch's corner (D, H, W)
  kOriginFlip = 5,     // 3 columns: 1 where the patch is mirrored
  kOriginColumns = 8,  // the width of a row
};
constexpr int64_t kTrainOrigin = 0;
constexpr int64_t kValOrigin = 1;

// The rows of `corners` ((n, 3) int64, host memory: windows' corners in
// volume `volume` of `set`, unmirrored) as sample origins.
at::Tensor window_origins(
    int64_t set, int64_t volume, const at::Tensor& corners);

// One slice's extraction: which slice of which volume, cut how, through
// which view (0: the patch, 1: its context crop), in which dtype.
struct SliceKey {
  // set, volume, slice index across the axis, the plane's corner (2) and
  // sides (2), its mirrors (2), view, dtype
  std::array<int64_t, 11> v{};
  bool operator==(const SliceKey& o) const {
    return v == o.v;
  }
};

// The keys of the slices of samples from `origins` ((n, kOriginColumns),
// host) of patches of sides `patch` (D, H, W), cut across `axis`, in the
// order the model takes them: sample by sample, each sample's slices in
// its (mirrored) order. `view` and `dtype` complete each key.
std::vector<SliceKey> slice_keys(
    const at::Tensor& origins,
    const std::array<int64_t, 3>& patch,
    int64_t axis,
    int64_t view,
    int64_t dtype);

// The blocks a feature cache allocates: `blocks` of `block` bytes each (a
// power of two: CUDA's pinned cache rounds to them).
struct CacheBlocks {
  int64_t block = 0;
  int64_t blocks = 0;
  int64_t bytes() const {
    return block * blocks;
  }
};

class FeatureCache {
 public:
  // `pinned`: page-locked host memory (CUDA), so that copies to and from
  // the device are asynchronous.
  explicit FeatureCache(bool pinned) : pinned_(pinned) {}

  // The blocks that keep `entries` maps of at most `entry_bytes` each, the
  // waste at each block's end and the 256-byte alignment included: one
  // block (the power of two above their bytes) up to 64 MiB, 64 MiB blocks
  // beyond.
  static CacheBlocks blocks_for(int64_t entries, int64_t entry_bytes);
  // What of `want` fits in `bytes`: whole blocks of its size, or, where
  // not even one fits, one block of the largest power of two that does.
  static CacheBlocks fit(const CacheBlocks& want, int64_t bytes);

  // What it may hold (the host plan's "feature cache" holder); none until
  // planned: nothing is stored or looked up. Setting it clears the counts
  // (the planner's probes are not the run's).
  void set_capacity(const CacheBlocks& blocks);
  int64_t capacity() const {
    return capacity_;
  }
  // Bytes held by its entries' blocks.
  int64_t held() const {
    return held_;
  }
  bool on() const {
    return capacity_ > 0;
  }

  // The stored maps of `key`, host memory, or nullptr; counts a hit or a
  // miss.
  const at::Tensor* find(const SliceKey& key);
  // Counts `n` slices extracted without keys (their origins unknown) as
  // misses.
  void missed(int64_t n) {
    if (on())
      misses_ += n;
  }
  // Stores a copy of `maps` (device or host) under `key` when it fits,
  // first come first kept (no eviction: samples come in a random order,
  // which an LRU smaller than the working set would only churn). On CUDA
  // the copy is asynchronous on the current stream: a later find()'s copy
  // back on that stream follows it.
  void store(const SliceKey& key, const at::Tensor& maps);

  // Hits and misses since the last take, then zero.
  std::pair<int64_t, int64_t> take_counts();

 private:
  struct Hash {
    size_t operator()(const SliceKey& k) const;
  };
  // `bytes` of a block, 256-byte aligned; empty when the capacity is spent.
  at::Tensor carve(int64_t bytes);

  bool pinned_;
  int64_t capacity_ = 0;
  int64_t block_ = 0;  // each block's bytes
  int64_t held_ = 0;   // blocks allocated
  std::vector<at::Tensor> blocks_;
  int64_t used_ = 0;  // of the last block
  std::unordered_map<SliceKey, at::Tensor, Hash> entries_;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace memtrain
