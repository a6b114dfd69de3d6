#pragma once
// GradientSync: sums the gradients of all ranks once per accumulation window.
//
// See Note [All-reduce only at the accumulation boundary]. Gradients are
// flattened into buckets of at most `bucket_bytes` (parameters in
// registration order; a parameter larger than a bucket gets its own), and
// each bucket is all-reduced with one call. A few float "extras" (the
// window's loss sum and sample count) ride in the tail of the last bucket, so
// the boundary needs no collective beyond the gradient's own.

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

class Communicator;

class GradientSync {
 public:
  // `params` must be the same list, in the same order, on every rank.
  GradientSync(
      Communicator& comm,
      std::vector<at::Tensor> params,
      int64_t bucket_bytes,
      int64_t num_extras);

  // Gives every parameter a zeroed gradient that is a view into its bucket
  // slot, so backward accumulates straight into the buckets (as c10d's
  // gradient_as_bucket_view): no second copy of the gradient exists and
  // sync() copies nothing in. Call at the start of a window (and again
  // after anything set the gradients to none). Local, no communication.
  void attach();

  // Collective, blocking (host path). Replaces every parameter's gradient by
  // the sum over ranks (a missing gradient counts as zeros; afterwards every
  // parameter has one, a view into the bucket, valid until the next sync) and
  // `extras` (size num_extras) by their sums. Callers weight the loss so that
  // the sum is the mean they want (see Note [Window weighting] in
  // trainer.cpp).
  void sync(std::vector<float>& extras);

  // After sync(): true when every summed gradient is finite. Identical on
  // every rank (the sums are), and an inf or NaN on any rank is one in the
  // sum, so no further collective is needed to agree on it.
  bool all_finite() const;

  int64_t num_buckets() const {
    return static_cast<int64_t>(buckets_.size());
  }
  // Bytes of one sync's payload (gradients + extras), all buckets.
  int64_t bytes_per_sync() const;

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each in `flat`
    at::Tensor flat;               // (numel + extras,) float32
  };
  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  int64_t num_extras_;
};

}  // namespace memtrain
