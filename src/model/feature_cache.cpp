#include "memtrain/model/feature_cache.h"

#include <torch/torch.h>

#include <algorithm>

#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"
#include "memtrain/util/fnv.h"

namespace memtrain {

// Note [The feature cache]
// ~~~~~~~~~~~~~~~~~~~~~~~~
// A frozen backbone maps the same slice to the same features every epoch;
// the seed's users paid for it again each time. With model.feature_cache=
// host the maps of each slice are kept in host memory and copied back:
// - The key is where the slice was cut from, not its content: the file
//   (training or validation), the volume, the slice's index across
//   model.slice_axis, the plane's corner and sides, its two mirrors
//   (data.flip; mirroring across the slice axis only reorders slices), the
//   view (the patch or its context crop, whose box follows from the same
//   corner) and the dtype. Each sample's origin comes from the patch reader
//   (Batch::origin) or the sliding window's windows, on the host: no hash
//   of the data, no device value read back. Volumes take no augmentation
//   but mirrors, and data.intensity_* are fixed for a run, so the same key
//   is the same input.
// - Bounded by the host plan: the "feature cache" holder gets what the
//   slices' maps would take, at most what the host budget leaves after the
//   other holders (Note [Host plan]); 0 before planning, so the planner's
//   probes neither fill nor count it. First come, first kept: no eviction,
//   as samples come in a random order and an LRU smaller than the working
//   set would only churn.
// - Memory: blocks of one size, a power of two (CUDA's pinned cache rounds
//   to them): the power of two above every map's bytes up to 64 MiB, else
//   64 MiB blocks, counted with the waste at each block's end; page-locked
//   on CUDA so that storing a miss (device to host) and
//   copying a hit back (host to device) are asynchronous on the current
//   stream, in order: neither is a host sync. On the CPU build the blocks
//   are the host domain's (memory::HostScope), outside the device budget.
// - A hit's maps are the ones computed in an earlier call, with that call's
//   batch of slices: equal to computing them again up to the backbone's
//   rounding in a batch of another size (the unit test bounds it).

namespace {

constexpr int64_t kBlock = int64_t{64} << 20;
constexpr int64_t kAlign = 256;

}  // namespace

at::Tensor window_origins(
    int64_t set, int64_t volume, const at::Tensor& corners) {
  MT_INTERNAL_ASSERT(
      corners.dim() == 2 && corners.size(1) == 3, "corners not (n, 3)");
  memory::HostScope host;  // host rows, whichever scope calls
  at::Tensor o = torch::zeros({corners.size(0), kOriginColumns}, torch::kLong);
  o.select(1, kOriginSet).fill_(set);
  o.select(1, kOriginVolume).fill_(volume);
  o.narrow(1, kOriginCorner, 3).copy_(corners);
  return o;
}

std::vector<SliceKey> slice_keys(
    const at::Tensor& origins,
    const std::array<int64_t, 3>& patch,
    int64_t axis,
    int64_t view,
    int64_t dtype) {
  MT_INTERNAL_ASSERT(
      origins.dim() == 2 && origins.size(1) == kOriginColumns &&
          origins.scalar_type() == torch::kLong && !origins.is_cuda(),
      "sample origins not (n, 8) int64 on the host");
  const at::Tensor o = origins.contiguous();
  const int64_t* p = o.data_ptr<int64_t>();
  const int64_t a = axis == 0 ? 1 : 0, b = axis == 2 ? 1 : 2;  // the plane
  const int64_t slices = patch[axis];
  std::vector<SliceKey> keys;
  keys.reserve(static_cast<size_t>(o.size(0) * slices));
  for (int64_t k = 0; k < o.size(0); ++k) {
    const int64_t* row = p + k * kOriginColumns;
    const int64_t* corner = row + kOriginCorner;
    const int64_t* flip = row + kOriginFlip;
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t at = corner[axis] + (flip[axis] ? slices - 1 - s : s);
      keys.push_back(SliceKey{
          {row[kOriginSet],
           row[kOriginVolume],
           at,
           corner[a],
           corner[b],
           patch[a],
           patch[b],
           flip[a],
           flip[b],
           view,
           dtype}});
    }
  }
  return keys;
}

size_t FeatureCache::Hash::operator()(const SliceKey& k) const {
  return static_cast<size_t>(fnv1a(kFnvOffset, k.v.data(), sizeof(k.v)));
}

namespace {

int64_t power_of_two_at_least(int64_t n) {
  int64_t p = kAlign;
  while (p < n)
    p *= 2;
  return p;
}

}  // namespace

CacheBlocks FeatureCache::blocks_for(int64_t entries, int64_t entry_bytes) {
  if (entries <= 0 || entry_bytes <= 0)
    return {};
  const int64_t aligned = (entry_bytes + kAlign - 1) / kAlign * kAlign;
  if (entries * aligned <= kBlock)
    return {power_of_two_at_least(entries * aligned), 1};
  const int64_t block = std::max(kBlock, power_of_two_at_least(aligned));
  const int64_t per = block / aligned;
  return {block, (entries + per - 1) / per};
}

CacheBlocks FeatureCache::fit(const CacheBlocks& want, int64_t bytes) {
  if (want.bytes() <= bytes)
    return want;
  if (bytes < kAlign)
    return {};
  if (bytes >= want.block)
    return {want.block, bytes / want.block};
  int64_t block = want.block;
  while (block > bytes)
    block /= 2;
  return block >= kAlign ? CacheBlocks{block, 1} : CacheBlocks{};
}

void FeatureCache::set_capacity(const CacheBlocks& blocks) {
  MT_INTERNAL_ASSERT(
      held_ == 0 || (blocks.block == block_ && blocks.bytes() >= held_),
      "feature cache resized below its blocks");
  capacity_ = blocks.bytes();
  block_ = blocks.block;
  hits_ = misses_ = 0;
}

at::Tensor FeatureCache::carve(int64_t bytes) {
  const int64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  if (blocks_.empty() || used_ + need > block_) {
    if (need > block_ || held_ + block_ > capacity_)
      return {};
    memory::HostScope host;  // CPU build: not the device budget's
    blocks_.push_back(torch::empty(
        {block_},
        torch::TensorOptions().dtype(torch::kByte).pinned_memory(pinned_)));
    held_ += block_;
    used_ = 0;
  }
  at::Tensor view = blocks_.back().narrow(0, used_, bytes);
  used_ += need;
  return view;
}

const at::Tensor* FeatureCache::find(const SliceKey& key) {
  if (!on())
    return nullptr;
  const auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return &it->second;
}

void FeatureCache::store(const SliceKey& key, const at::Tensor& maps) {
  if (!on() || entries_.count(key) != 0)
    return;
  const int64_t bytes =
      maps.numel() * static_cast<int64_t>(maps.element_size());
  at::Tensor block = carve(bytes);
  if (!block.defined())
    return;  // full: first come, first kept
  at::Tensor entry = block.view(maps.scalar_type()).view(maps.sizes());
  entry.copy_(maps, /*non_blocking=*/pinned_);
  entries_.emplace(key, std::move(entry));
}

std::pair<int64_t, int64_t> FeatureCache::take_counts() {
  const std::pair<int64_t, int64_t> c{hits_, misses_};
  hits_ = misses_ = 0;
  return c;
}

}  // namespace memtrain
