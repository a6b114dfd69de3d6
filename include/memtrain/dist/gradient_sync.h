#pragma once
// GradientSync: sums the gradients of all ranks once per accumulation window.
//
// See Note [All-reduce only at the accumulation boundary]. Gradients are
// flattened into buckets of at most `bucket_bytes`, filled in reverse
// registration order as c10d does (backward produces the last layers'
// gradients first); a parameter larger than a bucket gets its own. Each
// bucket is all-reduced with one call. A few float "extras" (the window's
// totals) ride in the tail of the last bucket -- the one holding the
// first-registered parameters (at most 1 MiB of them), whose gradients are
// ready last -- so the boundary needs no collective beyond the gradient's
// own.
//
// Overlap (Note [Overlapping the boundary all-reduce]): after arm(), the
// backward of the window's last micro-step all-reduces each bucket, except
// the last, as soon as all its gradients are final, while backward goes
// on; sync() then only launches what is left and waits.

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::autograd {
struct Node;
}

namespace memtrain {

class Communicator;
class CollectiveWork;

class GradientSync {
 public:
  // `params` must be the same list, in the same order, on every rank.
  GradientSync(
      Communicator& comm,
      std::vector<at::Tensor> params,
      int64_t bucket_bytes,
      int64_t num_extras);
  ~GradientSync();

  // Gives every parameter a zeroed gradient that is a view into its bucket
  // slot, so backward accumulates straight into the buckets (as c10d's
  // gradient_as_bucket_view): no second copy of the gradient exists and
  // sync() copies nothing in. Call at the start of a window, and again to
  // replay it (after an out-of-memory error): buckets whose all-reduce was
  // already launched in this window are then waited for and kept -- their
  // sums stand -- and their parameters accumulate the replay elsewhere.
  // Local, no communication (except waiting for launched buckets).
  void attach();

  // Before the backward of the window's last micro-step: from then on,
  // bucket b (except the last) is all-reduced as soon as every parameter
  // in it has its final gradient and buckets 0..b-1 are launched -- the
  // same order on every rank. Collective once a bucket is ready.
  void arm();

  // Collective. Launches the buckets not launched yet (in bucket order,
  // the last with `extras`: a float32 tensor of num_extras values on any
  // device, undefined when num_extras is 0), waits for every bucket
  // (wait_on_device: with NCCL the current stream waits, not the host),
  // and replaces every parameter's gradient by the sum over ranks (a
  // missing gradient counts as zeros; afterwards every parameter has one,
  // a view into the bucket, valid until the next attach). Returns the
  // extras' sums, a float32 tensor on the buckets' device (undefined
  // without extras); no host read. Callers weight the loss so that the sum
  // is the mean they want (see Note [Window weighting] in micro_step.cpp).
  at::Tensor sync(const at::Tensor& extras);

  // After sync(): adds 1 to `found` (float32 (1,), on the buckets' device)
  // when a summed gradient is inf or NaN, on the device (flag_nonfinite).
  // Identical on every rank (the sums are), and an inf or NaN on any rank
  // is one in the sum, so no further collective is needed to agree on it.
  void flag_nonfinite(const at::Tensor& found) const;

  int64_t num_buckets() const {
    return static_cast<int64_t>(buckets_.size());
  }
  // Bytes of one sync's payload (gradients + extras), all buckets.
  int64_t bytes_per_sync() const;
  // Buckets launched by backward hooks (before sync()) in the last window.
  int64_t launched_early() const {
    return launched_early_;
  }
  // Tests: after `n` buckets were launched in an armed backward, the next
  // gradient hook throws c10::OutOfMemoryError, once (-1: never).
  void inject_oom_after_launches(int64_t n) {
    inject_after_ = n;
  }

 private:
  struct Bucket {
    std::vector<size_t> params;    // indices into params_
    std::vector<int64_t> offsets;  // element offset of each in `flat`
    at::Tensor flat;               // (numel + extras,) float32
  };
  void on_gradient(size_t param);  // an AccumulateGrad post-hook
  void launch_ready();
  void launch(size_t bucket);

  Communicator& comm_;
  std::vector<at::Tensor> params_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // by parameter
  int64_t num_extras_;
  // Kept alive so that the hooks on them stay (as c10d's reducer does).
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  // The window in progress.
  bool armed_ = false;
  std::vector<int64_t> pending_;  // by bucket: gradients still to come
  std::vector<bool> seen_;        // by parameter, in the armed backward
  size_t launched_ = 0;           // buckets 0..launched_-1 launched
  std::vector<std::unique_ptr<CollectiveWork>> works_;  // by bucket
  int64_t launched_early_ = 0;
  int64_t inject_after_ = -1;
};

}  // namespace memtrain
