#include "memtrain/data/sampling/sharded_sampler.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Global windows]
// DistributedSampler in PyTorch shards the dataset per rank first, so the
// samples that meet in one optimizer step depend on the world size. memtrain
// shards each window instead: the epoch permutation is global and window w
// always holds the same B samples, so 1 rank x 4 micro-steps x 2 and
// 2 ranks x 2 x 2 and 1 x 1 x 8 train on identical batches, and a run can
// resume at another world size from the same (epoch, window). A short last
// window is split the same way; a rank whose share is empty still joins the
// all-reduce with zero gradient, so no rank ever waits for a peer that has
// left the epoch.

ShardedSampler::ShardedSampler(
    int64_t num_samples,
    int64_t effective_batch,
    int rank,
    int world_size,
    uint64_t seed,
    bool drop_last)
    : num_samples_(num_samples),
      rank_(rank),
      world_size_(world_size),
      seed_(seed),
      effective_batch_(effective_batch) {
  MT_INTERNAL_ASSERT(
      num_samples > 0 && effective_batch > 0 && world_size > 0 && rank >= 0 &&
      rank < world_size);
  windows_per_epoch_ =
      drop_last ? num_samples / effective_batch_
                : (num_samples + effective_batch_ - 1) / effective_batch_;
  MT_CHECK(
      windows_per_epoch_ > 0,
      "data: the training set has ",
      num_samples,
      " samples, fewer than one accumulation window of ",
      effective_batch_,
      " (the effective batch: ranks x accumulation steps x micro-batch) and "
      "data.drop_last is true; lower data.batch_size, "
      "training.gradient_accumulation_steps or "
      "training.effective_batch_size, or set data.drop_last=false");
}

void ShardedSampler::ensure_epoch(int64_t epoch) const {
  if (epoch == cached_epoch_)
    return;
  perm_.resize(num_samples_);
  std::iota(perm_.begin(), perm_.end(), int64_t{0});
  // Fisher-Yates with our own index draw: std::shuffle and
  // std::uniform_int_distribution differ between standard libraries, and the
  // permutation must not.
  std::seed_seq seq{
      static_cast<uint32_t>(seed_),
      static_cast<uint32_t>(seed_ >> 32),
      static_cast<uint32_t>(epoch),
      static_cast<uint32_t>(static_cast<uint64_t>(epoch) >> 32)};
  std::mt19937_64 rng(seq);
  for (int64_t i = num_samples_ - 1; i > 0; --i) {
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    // Rejection sampling for an unbiased draw in [0, bound).
    const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);
    uint64_t r;
    do {
      r = rng();
    } while (r >= limit);
    std::swap(perm_[i], perm_[static_cast<int64_t>(r % bound)]);
  }
  cached_epoch_ = epoch;
}

std::vector<int64_t> ShardedSampler::permutation(int64_t epoch) const {
  ensure_epoch(epoch);
  return perm_;
}

std::vector<int64_t> ShardedSampler::window_indices(
    int64_t epoch, int64_t w) const {
  MT_INTERNAL_ASSERT(w >= 0 && w < windows_per_epoch_);
  ensure_epoch(epoch);
  const int64_t begin = w * effective_batch_;
  const int64_t end = std::min(begin + effective_batch_, num_samples_);
  return std::vector<int64_t>(perm_.begin() + begin, perm_.begin() + end);
}

WindowPlan ShardedSampler::plan(int64_t epoch, int64_t w) const {
  const std::vector<int64_t> all = window_indices(epoch, w);
  WindowPlan p;
  p.epoch = epoch;
  p.window = w;
  p.global_samples = static_cast<int64_t>(all.size());
  const auto [begin, end] = rank_slice(p.global_samples, rank_, world_size_);
  p.rank_indices.assign(all.begin() + begin, all.begin() + end);
  p.rank_offset = begin;
  return p;
}

std::vector<std::vector<int64_t>> split_micro_batches(
    const std::vector<int64_t>& indices, int64_t micro) {
  MT_INTERNAL_ASSERT(micro > 0);
  std::vector<std::vector<int64_t>> out;
  for (size_t s = 0; s < indices.size(); s += static_cast<size_t>(micro)) {
    const size_t e = std::min(indices.size(), s + static_cast<size_t>(micro));
    out.emplace_back(indices.begin() + s, indices.begin() + e);
  }
  return out;
}

std::vector<std::vector<int64_t>> split_micro_batches_evenly(
    const std::vector<int64_t>& indices, int64_t count) {
  MT_INTERNAL_ASSERT(count > 0);
  const int64_t n = static_cast<int64_t>(indices.size());
  std::vector<std::vector<int64_t>> out;
  int64_t begin = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t size = n / count + (k < n % count ? 1 : 0);
    out.emplace_back(indices.begin() + begin, indices.begin() + begin + size);
    begin += size;
  }
  return out;
}

}  // namespace memtrain
