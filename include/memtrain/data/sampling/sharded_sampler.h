#pragma once
// ShardedSampler: which samples each rank reads in each accumulation window.
//
// See Note [Global windows]: every epoch has one permutation of all N
// samples, the same on every rank and independent of the world size. Window w
// is the slice [w*B, (w+1)*B) of it (B = the effective batch, by default
// world * accumulation * micro-batch), cut into `world` contiguous,
// near-equal rank shares; each rank cuts its share into micro-batches of its
// current micro-batch size (split_micro_batches). So the global sample set of a
// window does not depend on how it is split, every rank runs the same number
// of windows (derived from N and B alone), and a position (epoch, window) is
// all a resume needs.

#include <cstdint>
#include <vector>

namespace memtrain {

struct WindowPlan {
  int64_t epoch = 0;
  int64_t window = 0;
  int64_t global_samples = 0;  // samples in the window over all ranks
  // This rank's share (dataset indices), in order; empty when the rank's
  // share of a short last window is empty.
  std::vector<int64_t> rank_indices;
  // Where this rank's share starts in the window's samples (ranks' shares
  // are contiguous, in rank order).
  int64_t rank_offset = 0;
};

// Cuts `indices` into consecutive micro-batches of `micro` samples, the last
// possibly smaller.
std::vector<std::vector<int64_t>> split_micro_batches(
    const std::vector<int64_t>& indices, int64_t micro);

// Cuts `indices` into `count` consecutive micro-batches of near-equal sizes
// (differing by at most one, the larger first); empty ones when there are
// fewer indices than `count`. model.sync_bn: every rank runs the same
// number of micro-steps, ceil(ceil(n / world) / micro) for a window of n
// samples (micro_steps_for, data/sampling/window_shape.h).
std::vector<std::vector<int64_t>> split_micro_batches_evenly(
    const std::vector<int64_t>& indices, int64_t count);

class ShardedSampler {
 public:
  // Throws memtrain::Error when the configuration gives no window at all.
  ShardedSampler(
      int64_t num_samples,
      int64_t effective_batch,
      int rank,
      int world_size,
      uint64_t seed,
      bool drop_last);

  int64_t effective_batch() const {
    return effective_batch_;
  }
  int64_t windows_per_epoch() const {
    return windows_per_epoch_;
  }
  int64_t num_samples() const {
    return num_samples_;
  }
  // The largest rank share of a full window: ceil(B / world).
  int64_t max_rank_share() const {
    return (effective_batch_ + world_size_ - 1) / world_size_;
  }

  // The epoch's permutation of 0..N-1 (same on every rank).
  std::vector<int64_t> permutation(int64_t epoch) const;

  // All samples of window `w` of `epoch`, over all ranks, in order.
  std::vector<int64_t> window_indices(int64_t epoch, int64_t w) const;

  // This rank's part of window `w`.
  WindowPlan plan(int64_t epoch, int64_t w) const;

 private:
  void ensure_epoch(int64_t epoch) const;

  int64_t num_samples_;
  int rank_;
  int world_size_;
  uint64_t seed_;
  int64_t effective_batch_;
  int64_t windows_per_epoch_;
  mutable int64_t cached_epoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

}  // namespace memtrain
