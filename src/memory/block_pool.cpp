#include "memtrain/memory/block_pool.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace memtrain::memory {

// Note [CPU block pool]
// The first accounting allocator cached a freed device block by its exact
// size and reused it only for a request of that size. A model whose
// activations change shape from layer to layer (a U-Net's levels, a
// SwinUNETR's stages) kept every size it ever used: with no cap the cache
// was never released, and reserved passed twice the tensors' peak. The
// pool behaves like
// CUDA's caching allocator with expandable_segments:True, the setting
// PyTorch recommends against fragmentation:
// - Small requests (<= 64 KiB) round up to 512 bytes and come from 128 KiB
//   segments of their own (CUDA: 1 MiB, from 2 MiB segments), so that
//   small long-lived blocks do not pin holes among the large ones.
// - Large requests round up to a page and come from one range of address
//   space, reserved once (MAP_NORESERVE: nothing is resident until used)
//   and grown at its top. Freed neighbours merge across what would have
//   been separate segments, so a large request fits any hole big enough.
// - A request takes the smallest free block that fits (best fit) and
//   splits off the rest: cached blocks first, which cost nothing; then
//   bytes newly made resident (a released block, or the range's top), which
//   count against the cap.
// - reserved = what is resident for the pool: small segments, live large
//   blocks and cached large ones. A request that would take it past the
//   cap first releases every free block (small segments are unmapped,
//   large blocks madvise(MADV_DONTNEED)d) and retries, then is refused:
//   the caller throws c10::OutOfMemoryError, as CUDA.
// Memory comes from mmap, not malloc: glibc keeps what is freed in its
// heap, where neither reserved nor release() could see it.
// Measured (ARCHITECTURE.md, "Host memory"): MONAI's SwinUNETR (feature
// 12, 64^3, micro-batch 2, fp32) peaks at 1879 MiB of tensors; the
// exact-size cache reserved 4046 MiB at the peak, this pool 1943 MiB.

namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

void* map_bytes(size_t bytes, int extra_flags) {
  void* p = mmap(
      nullptr,
      bytes,
      PROT_READ | PROT_WRITE,
      MAP_PRIVATE | MAP_ANONYMOUS | extra_flags,
      -1,
      0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

BlockPool::BlockPool(size_t range_bytes)
    : page_(
          std::max<size_t>(4096, static_cast<size_t>(::sysconf(_SC_PAGESIZE)))),
      range_bytes_(range_bytes) {
  if (range_bytes_ == 0) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    range_bytes_ = 2 * static_cast<size_t>(pages > 0 ? pages : 1 << 20) *
                   static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  }
  range_bytes_ = round_up(range_bytes_, page_);
}

BlockPool::~BlockPool() {
  std::vector<Block*> all;
  for (auto& [p, b] : live_)
    all.push_back(b);
  for (const FreeSet* set : {&small_free_, &large_cached_, &released_})
    all.insert(all.end(), set->begin(), set->end());
  for (Block* b : all) {
    if (b->small && b->prev == nullptr) {
      size_t bytes = 0;
      for (Block* n = b; n != nullptr; n = n->next)
        bytes += n->size;
      munmap(b->ptr, bytes);
    }
  }
  if (range_ != nullptr)
    munmap(range_, range_bytes_);
  for (Block* b : all)
    delete b;
}

BlockPool::Taken BlockPool::take(size_t nbytes, int64_t cap) {
  if (nbytes > range_bytes_) {  // (and no rounding below can overflow)
    Taken refused;
    refused.over_cap = cap > 0;
    return refused;
  }
  const size_t size = round_up(nbytes == 0 ? 1 : nbytes, kRound);
  return size <= kSmallSize ? take_small(size, cap)
                            : take_large(round_up(size, page_), cap);
}

bool BlockPool::fits(size_t more, int64_t cap) {
  const auto within = [&] {
    return cap <= 0 || reserved_ + static_cast<int64_t>(more) <= cap;
  };
  if (within())
    return true;
  release();  // as CUDA: give back the cached blocks, then retry
  return within();
}

BlockPool::Block* BlockPool::best_fit(FreeSet& set, size_t size) {
  Block key{nullptr, size, false, true, true, nullptr, nullptr};
  auto it = set.lower_bound(&key);
  if (it == set.end())
    return nullptr;
  Block* b = *it;
  set.erase(it);
  return b;
}

BlockPool::Taken BlockPool::hand_out(Block* b) {
  b->free = false;
  live_.emplace(b->ptr, b);
  allocated_ += static_cast<int64_t>(b->size);
  return {b->ptr, b->size, false};
}

BlockPool::Taken BlockPool::take_small(size_t size, int64_t cap) {
  Block* b = best_fit(small_free_, size);
  if (b == nullptr) {
    Taken refused;
    if (!fits(kSmallSegment, cap)) {
      refused.over_cap = true;
      return refused;
    }
    void* p = map_bytes(kSmallSegment, 0);
    if (p == nullptr)
      return refused;
    b = new Block{
        static_cast<char*>(p),
        kSmallSegment,
        true,
        true,
        true,
        nullptr,
        nullptr};
    reserved_ += static_cast<int64_t>(kSmallSegment);
    ++small_segments_;
  }
  split(b, size, kRound, small_free_);
  return hand_out(b);
}

BlockPool::Taken BlockPool::take_large(size_t size, int64_t cap) {
  if (Block* b = best_fit(large_cached_, size)) {
    split(b, size, page_, large_cached_);
    return hand_out(b);
  }
  Taken refused;
  if (!fits(size, cap)) {
    refused.over_cap = true;
    return refused;
  }
  Block* b = best_fit(released_, size);
  if (b == nullptr && (b = grow_range(size)) == nullptr)
    return refused;
  split(b, size, page_, released_);
  b->resident = true;
  reserved_ += static_cast<int64_t>(b->size);
  return hand_out(b);
}

BlockPool::Block* BlockPool::grow_range(size_t size) {
  if (range_ == nullptr) {
    // Address space only; halved while the kernel refuses it (a ulimit -v,
    // strict overcommit), down to 64 MiB (or the size asked, if smaller).
    const size_t floor = std::min(range_bytes_, size_t{64} << 20);
    for (;;) {
      range_ = static_cast<char*>(map_bytes(range_bytes_, MAP_NORESERVE));
      if (range_ != nullptr || range_bytes_ / 2 < floor)
        break;
      range_bytes_ = round_up(range_bytes_ / 2, page_);
    }
    if (range_ == nullptr)
      return nullptr;
    // Transparent huge pages would make a touched page of the range 2 MiB
    // resident and refill released holes (THP "always"): not here.
    madvise(range_, range_bytes_, MADV_NOHUGEPAGE);
  }
  if (last_ != nullptr && last_->free && !last_->resident) {
    // The released block at the top grows into the range.
    const size_t more = size - last_->size;
    if (top_ + more > range_bytes_)
      return nullptr;
    released_.erase(last_);
    last_->size += more;
    top_ += more;
    return last_;
  }
  if (top_ + size > range_bytes_)
    return nullptr;
  Block* b = new Block{range_ + top_, size, false, true, false, last_, nullptr};
  if (last_ != nullptr)
    last_->next = b;
  last_ = b;
  top_ += size;
  return b;
}

void BlockPool::split(Block* b, size_t size, size_t min_rest, FreeSet& set) {
  const size_t rest = b->size - size;
  if (rest < min_rest)
    return;
  Block* r =
      new Block{b->ptr + size, rest, b->small, true, b->resident, b, b->next};
  if (b->next != nullptr)
    b->next->prev = r;
  b->next = r;
  if (last_ == b)
    last_ = r;
  b->size = size;
  set.insert(r);
}

BlockPool::Block* BlockPool::merge(Block* b, FreeSet& set) {
  const auto joins = [&](const Block* n) {
    return n != nullptr && n->free && n->resident == b->resident;
  };
  if (Block* p = b->prev; joins(p)) {
    set.erase(p);
    p->size += b->size;
    p->next = b->next;
    if (b->next != nullptr)
      b->next->prev = p;
    if (last_ == b)
      last_ = p;
    delete b;
    b = p;
  }
  if (Block* n = b->next; joins(n)) {
    set.erase(n);
    b->size += n->size;
    b->next = n->next;
    if (n->next != nullptr)
      n->next->prev = b;
    if (last_ == n)
      last_ = b;
    delete n;
  }
  return b;
}

size_t BlockPool::give_back(void* ptr) {
  auto it = live_.find(ptr);
  if (it == live_.end())
    return 0;
  Block* b = it->second;
  live_.erase(it);
  const size_t size = b->size;
  allocated_ -= static_cast<int64_t>(size);
  b->free = true;
  FreeSet& set = set_of(b);
  set.insert(merge(b, set));
  return size;
}

int64_t BlockPool::release() {
  const int64_t before = reserved_;
  for (auto it = small_free_.begin(); it != small_free_.end();) {
    Block* b = *it;
    if (b->prev == nullptr && b->next == nullptr) {  // a whole segment
      it = small_free_.erase(it);
      munmap(b->ptr, b->size);
      reserved_ -= static_cast<int64_t>(b->size);
      --small_segments_;
      delete b;
    } else {
      ++it;
    }
  }
  // In address order, so that each block merges backwards into released
  // neighbours (released before, or earlier in this loop) and forwards
  // only into blocks released before: the cached ones after it still wait
  // their turn.
  std::vector<Block*> cached(large_cached_.begin(), large_cached_.end());
  large_cached_.clear();
  std::sort(cached.begin(), cached.end(), [](const Block* a, const Block* b) {
    return a->ptr < b->ptr;
  });
  for (Block* b : cached) {
    if (madvise(b->ptr, b->size, MADV_DONTNEED) != 0) {
      large_cached_.insert(b);  // still resident: stays cached
      continue;
    }
    reserved_ -= static_cast<int64_t>(b->size);
    b->resident = false;
    released_.insert(merge(b, released_));
  }
  if (reserved_ < before)
    ++releases_;
  return before - reserved_;
}

}  // namespace memtrain::memory
