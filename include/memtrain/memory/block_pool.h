#pragma once
// The device domain's memory on the CPU device: small blocks carved from
// small mapped segments, large ones from one expandable range, the way
// CUDA's caching allocator keeps them with expandable_segments:True (Note
// [CPU block pool] in block_pool.cpp). Not thread-safe: the accounting
// allocator calls it under its lock.

#include <cstddef>
#include <cstdint>
#include <set>
#include <unordered_map>

namespace memtrain::memory {

class BlockPool {
 public:
  static constexpr size_t kRound = 512;               // small sizes round up
  static constexpr size_t kSmallSize = 64 << 10;      // small: <= 64 KiB
  static constexpr size_t kSmallSegment = 128 << 10;  // a small segment

  struct Taken {
    void* ptr = nullptr;    // null: refused (see over_cap)
    size_t size = 0;        // the block's size (>= the request)
    bool over_cap = false;  // refused by the cap, not by the kernel
  };

  // `range_bytes`: the virtual range large blocks are carved from (0: the
  // machine's memory, twice; address space only, nothing is resident
  // until it is used). Reserved lazily, at the first large block.
  explicit BlockPool(size_t range_bytes = 0);

  // Large sizes round up to the kernel's page (4 KiB on x86-64, 16 or 64
  // KiB on some arm64 kernels), so that a released block's pages are its
  // own.
  size_t page() const {
    return page_;
  }
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();  // unmaps everything: only for pools no tensor uses

  // A block of at least `nbytes`: the smallest resident free block that
  // fits, else bytes newly made resident -- the smallest released free
  // block that fits, or the range's top -- which count against `cap`
  // (> 0): when they would pass it, the pool first releases its free
  // blocks; if they still would, nothing is taken and over_cap is set.
  // A kernel refusal (or a full range) leaves ptr null, over_cap false.
  Taken take(size_t nbytes, int64_t cap);
  // Frees the block at `ptr` (it stays resident, cached), merging it with
  // free resident neighbours; returns its size, 0 when `ptr` is not a live
  // block of this pool.
  size_t give_back(void* ptr);
  // Gives every free block's pages back to the kernel: wholly free small
  // segments are unmapped, free large blocks released (madvise); returns
  // the bytes reserved() dropped by.
  int64_t release();

  int64_t allocated() const {
    return allocated_;
  }
  // Bytes resident for the pool: small segments, live large blocks and
  // cached (free, not released) large blocks.
  int64_t reserved() const {
    return reserved_;
  }
  // release() calls that gave something back, a request's among them.
  int64_t releases() const {
    return releases_;
  }
  size_t small_segments() const {
    return small_segments_;
  }
  // How far into its range large blocks have reached.
  size_t range_top() const {
    return top_;
  }

 private:
  struct Block {
    char* ptr;
    size_t size;
    bool small;
    bool free;
    bool resident;  // large blocks: false once released, until taken
    Block* prev;    // neighbours in the same segment or range
    Block* next;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeSet = std::set<Block*, BySize>;

  // Takes the smallest block of `set` of at least `size` out of it; null
  // when none is that large.
  Block* best_fit(FreeSet& set, size_t size);
  // Marks `b` live and counts it allocated.
  Taken hand_out(Block* b);
  Taken take_small(size_t size, int64_t cap);
  Taken take_large(size_t size, int64_t cap);
  bool fits(size_t more, int64_t cap);
  Block* grow_range(size_t size);
  // Splits the part past `size` off `b` into `set` when it is at least
  // `min_rest`.
  void split(Block* b, size_t size, size_t min_rest, FreeSet& set);
  // Merges free `b` with its free neighbours of the same residency (which
  // leave `set`); returns the merged block, not in `set`.
  Block* merge(Block* b, FreeSet& set);
  FreeSet& set_of(const Block* b) {
    return b->small ? small_free_ : b->resident ? large_cached_ : released_;
  }

  FreeSet small_free_;
  FreeSet large_cached_;  // free, resident
  FreeSet released_;      // free, given back to the kernel
  std::unordered_map<void*, Block*> live_;
  int64_t allocated_ = 0;
  int64_t reserved_ = 0;
  size_t small_segments_ = 0;
  int64_t releases_ = 0;
  size_t page_;
  size_t range_bytes_;
  char* range_ = nullptr;
  size_t top_ = 0;
  Block* last_ = nullptr;  // the range's last block
};

}  // namespace memtrain::memory
