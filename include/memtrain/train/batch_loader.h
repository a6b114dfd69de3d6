#pragma once
// Batches and where their samples come from: rows of a features/images file
// (RowSource) or patches of a volume file (PatchSource). A source reads a
// micro-batch into host tensors; the Prefetcher (prefetcher.h) runs sources
// on background threads.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "memtrain/data/patch_sampler.h"
#include "memtrain/train/image_augment.h"

namespace memtrain {

class H5Dataset;

struct Batch {
  at::Tensor x;        // (n, F), (n, C, H, W) or (n, C, D, H, W) float32
  at::Tensor y;        // (n,) or (n, D, H, W) int64
  at::Tensor context;  // (n, F2) float32, or undefined
  int64_t size() const;
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  // Reads samples `ids` of `epoch` into `into`, whose tensors are host
  // memory of the shapes batch_shapes(ids.size()) gives. Safe to call from
  // several threads at once.
  virtual void read(
      int64_t epoch, const std::vector<int64_t>& ids, Batch& into) const = 0;
  // Empty tensors of the right shapes for `n` samples (context undefined
  // when the source has none), allocated with `pinned` page-locking on CUDA.
  virtual Batch allocate(int64_t n, bool pinned) const = 0;
};

// Dataset rows: sample i is row i. Images are transformed by `transform`
// (augmentation drawn from (seed, epoch, i), normalisation; Note [Image
// augmentation]); without one the epoch does not matter.
class RowSource : public SampleSource {
 public:
  explicit RowSource(const H5Dataset& data, ImageTransform transform = {})
      : data_(data), transform_(transform) {}
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override;
  Batch allocate(int64_t n, bool pinned) const override;

 private:
  const H5Dataset& data_;
  ImageTransform transform_;
};

// Volume patches: sample i of an epoch is sampler.at(epoch, i).
class PatchSource : public SampleSource {
 public:
  PatchSource(const H5Dataset& data, const PatchSampler& sampler)
      : data_(data), sampler_(sampler) {}
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override;
  Batch allocate(int64_t n, bool pinned) const override;

 private:
  const H5Dataset& data_;
  const PatchSampler& sampler_;
};

}  // namespace memtrain
