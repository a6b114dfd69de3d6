#pragma once
// Batches and where their samples come from: rows of a features/images file
// (RowSource) or patches of a volume file (PatchSource). A source reads a
// micro-batch into host tensors; the Prefetcher (prefetcher.h) runs sources
// on background threads.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/input/context_crop.h"
#include "memtrain/input/image_augment.h"

namespace memtrain {

class H5Dataset;

struct Batch {
  at::Tensor x;  // (n, F), (n, C, H, W) or (n, C, D, H, W) float32
  at::Tensor y;  // (n,) or (n, D, H, W) int64; (n, T) float32 targets
  // (n, F2) float32 /context_features, (n, C, D, H, W) float32 context
  // crops (model.context), or undefined
  at::Tensor context;
  // (n, kOriginColumns) int64, host memory: where each patch was cut from
  // (model/feature_cache.h; a model's feature cache keys on it), or
  // undefined
  at::Tensor origin;
  int64_t size() const;
};

// Samples must hold finite numbers (training.nonfinite): check() names the
// file, the dataset and the samples of the first batch read that holds NaN
// or Inf. `stop` (training.nonfinite=stop) throws memtrain::Error then;
// otherwise it warns once (stderr and the rank log) and lets the window's
// non-finite loss be skipped. Read as they are read: one pass over the
// batch's floats on the reader thread, none after the warning.
class FiniteCheck {
 public:
  FiniteCheck(std::string role, bool stop)
      : role_(std::move(role)), stop_(stop) {}
  // `x` (n, ...) float32 host memory read from `dataset` of `file`; sample
  // k of it is where(k) ("row 17"). Thread-safe.
  void check(
      const std::string& file,
      const std::string& dataset,
      const at::Tensor& x,
      int64_t epoch,
      const std::function<std::string(int64_t)>& where) const;

 private:
  std::string role_;  // "data.train", "data.val"
  bool stop_;
  mutable std::atomic<bool> told_{false};
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
  explicit RowSource(
      const H5Dataset& data,
      ImageTransform transform = {},
      const FiniteCheck* finite = nullptr)
      : data_(data), transform_(transform), finite_(finite) {}
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override;
  Batch allocate(int64_t n, bool pinned) const override;

 private:
  const H5Dataset& data_;
  ImageTransform transform_;
  const FiniteCheck* finite_;
};

// Volume patches: sample i of an epoch is sampler.at(epoch, i), its
// origin in Batch::origin (set kTrainOrigin) when `origins`. With a
// `context` view on, each patch's context crop too (input/context_crop.h:
// its box read from the file, resized to the patch, flipped with it) into
// Batch::context.
class PatchSource : public SampleSource {
 public:
  PatchSource(
      const H5Dataset& data,
      const PatchSampler& sampler,
      const FiniteCheck* finite = nullptr,
      ContextView context = {},
      bool origins = false)
      : data_(data),
        sampler_(sampler),
        finite_(finite),
        context_(context),
        origins_(origins) {}
  void read(int64_t epoch, const std::vector<int64_t>& ids, Batch& into)
      const override;
  Batch allocate(int64_t n, bool pinned) const override;

 private:
  const H5Dataset& data_;
  const PatchSampler& sampler_;
  const FiniteCheck* finite_;
  ContextView context_;
  bool origins_;
};

}  // namespace memtrain
