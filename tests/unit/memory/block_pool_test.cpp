// memory/block_pool.h: the CPU device's small segments and large range, as
// CUDA's caching allocator keeps them with expandable segments (Note [CPU
// block pool]).

#include "memtrain/memory/block_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace memtrain::memory {
namespace {

constexpr int64_t u = int64_t{1} << 20;  // large requests below: in MiB
constexpr int64_t kSegment = BlockPool::kSmallSegment;

char* at(const BlockPool::Taken& t) {
  return static_cast<char*>(t.ptr);
}

TEST(BlockPool, SmallRequestsShareOneSegmentAndSplitIt) {
  BlockPool pool;
  const BlockPool::Taken a = pool.take(1000, 0);  // rounds to 1024
  const BlockPool::Taken b = pool.take(4096, 0);
  ASSERT_NE(a.ptr, nullptr);
  ASSERT_NE(b.ptr, nullptr);
  EXPECT_EQ(a.size, 1024u);
  EXPECT_EQ(b.size, 4096u);
  EXPECT_EQ(at(b) - at(a), 1024);
  EXPECT_EQ(pool.small_segments(), 1u);
  EXPECT_EQ(pool.reserved(), kSegment);
  EXPECT_EQ(pool.allocated(), 1024 + 4096);
  std::memset(a.ptr, 1, 1000);  // the memory is usable
  std::memset(b.ptr, 2, 4096);
  EXPECT_EQ(pool.give_back(a.ptr), 1024u);
  EXPECT_EQ(pool.give_back(b.ptr), 4096u);
  EXPECT_EQ(pool.give_back(b.ptr), 0u);  // not live any more
  EXPECT_EQ(pool.allocated(), 0);
  EXPECT_EQ(pool.reserved(), kSegment);  // cached, as CUDA
  EXPECT_EQ(pool.release(), kSegment);
  EXPECT_EQ(pool.reserved(), 0);
  EXPECT_EQ(pool.small_segments(), 0u);
}

// What separate segments cannot do: large blocks taken one after another
// lie side by side in the range, and freed neighbours merge into a block
// that serves a request as large as both, with nothing new made resident.
TEST(BlockPool, LargeNeighboursMergeAcrossTheRange) {
  BlockPool pool;
  const BlockPool::Taken a = pool.take(1 * u, 0);
  const BlockPool::Taken b = pool.take(2 * u - 100, 0);  // rounds to 2 MiB
  const BlockPool::Taken c = pool.take(1 * u, 0);
  EXPECT_EQ(b.size, size_t(2 * u));
  EXPECT_EQ(at(b) - at(a), 1 * u);
  EXPECT_EQ(at(c) - at(b), 2 * u);
  EXPECT_EQ(pool.reserved(), 4 * u);
  EXPECT_EQ(pool.range_top(), size_t(4 * u));
  pool.give_back(b.ptr);
  pool.give_back(a.ptr);
  EXPECT_EQ(pool.reserved(), 4 * u);  // cached
  const BlockPool::Taken ab = pool.take(3 * u, 0);
  EXPECT_EQ(ab.ptr, a.ptr);
  EXPECT_EQ(pool.reserved(), 4 * u);
  EXPECT_EQ(pool.range_top(), size_t(4 * u));
  // A cached block larger than the request is split; the rest serves the
  // next one.
  pool.give_back(ab.ptr);
  const BlockPool::Taken x = pool.take(BlockPool::kSmallSize + 1, 0);
  const BlockPool::Taken y = pool.take(2 * u, 0);
  EXPECT_EQ(x.ptr, a.ptr);
  EXPECT_EQ(x.size, BlockPool::kSmallSize + pool.page());  // a page more
  EXPECT_EQ(at(y), at(x) + x.size);
  EXPECT_EQ(pool.reserved(), 4 * u);
  pool.give_back(x.ptr);
  pool.give_back(y.ptr);
  pool.give_back(c.ptr);
  EXPECT_EQ(pool.allocated(), 0);
  EXPECT_EQ(pool.release(), 4 * u);
  EXPECT_EQ(pool.reserved(), 0);
}

TEST(BlockPool, BestFitTakesTheSmallestFreeBlock) {
  BlockPool pool;
  // Live one-page blocks keep the three apart.
  const BlockPool::Taken a = pool.take(4 * u, 0);
  const BlockPool::Taken s1 = pool.take(BlockPool::kSmallSize + 1, 0);
  const BlockPool::Taken b = pool.take(6 * u, 0);
  const BlockPool::Taken s2 = pool.take(BlockPool::kSmallSize + 1, 0);
  const BlockPool::Taken c = pool.take(10 * u, 0);
  pool.give_back(c.ptr);
  pool.give_back(b.ptr);
  pool.give_back(a.ptr);
  EXPECT_EQ(pool.take(5 * u, 0).ptr, b.ptr);
  EXPECT_EQ(pool.take(3 * u, 0).ptr, a.ptr);
  EXPECT_EQ(pool.take(7 * u, 0).ptr, c.ptr);
  EXPECT_NE(s1.ptr, nullptr);
  EXPECT_NE(s2.ptr, nullptr);
}

// The cap: bytes newly made resident that would pass it first release the
// free blocks; what is released is reused (the range's top grows into it);
// past the cap, nothing is taken.
TEST(BlockPool, CapReleasesFreeBlocksThenRefuses) {
  BlockPool pool;
  const BlockPool::Taken a = pool.take(4 * u, 10 * u);
  const BlockPool::Taken b = pool.take(4 * u, 10 * u);
  pool.give_back(b.ptr);
  EXPECT_EQ(pool.reserved(), 8 * u);
  // 6 MiB do not fit the cached 4; making 6 more resident would make 14.
  const BlockPool::Taken c = pool.take(6 * u, 10 * u);
  ASSERT_NE(c.ptr, nullptr);
  EXPECT_EQ(c.ptr, b.ptr);  // b was released, then grown at the top
  EXPECT_EQ(pool.reserved(), 10 * u);
  EXPECT_EQ(pool.range_top(), size_t(10 * u));
  const BlockPool::Taken d = pool.take(2 * u, 10 * u);
  EXPECT_EQ(d.ptr, nullptr);
  EXPECT_TRUE(d.over_cap);
  const BlockPool::Taken e = pool.take(1000, 10 * u);  // a small segment
  EXPECT_EQ(e.ptr, nullptr);
  EXPECT_TRUE(e.over_cap);
  EXPECT_EQ(pool.reserved(), 10 * u);
  EXPECT_EQ(pool.allocated(), 10 * u);
  pool.give_back(a.ptr);
  pool.give_back(c.ptr);
}

// Released pages really go back to the kernel: taken again, they read as
// the zeros of fresh pages, not as what was written before.
TEST(BlockPool, ReleasedPagesComeBackZeroed) {
  BlockPool pool;
  const BlockPool::Taken a = pool.take(2 * u, 0);
  std::memset(a.ptr, 0xab, 2 * u);
  pool.give_back(a.ptr);
  const BlockPool::Taken cached = pool.take(2 * u, 0);
  ASSERT_EQ(cached.ptr, a.ptr);
  EXPECT_EQ(static_cast<unsigned char*>(cached.ptr)[12345], 0xab);
  pool.give_back(cached.ptr);
  EXPECT_EQ(pool.release(), 2 * u);
  const BlockPool::Taken fresh = pool.take(2 * u, 0);
  ASSERT_EQ(fresh.ptr, a.ptr);
  EXPECT_EQ(static_cast<unsigned char*>(fresh.ptr)[12345], 0);
  EXPECT_EQ(pool.reserved(), 2 * u);
  pool.give_back(fresh.ptr);
}

// The range is address space, not memory; a request beyond it is the
// kernel's refusal (null, not over the cap) or, under a cap, the cap's;
// nothing is taken. A range smaller than the usual 64 MiB floor is still
// reserved.
TEST(BlockPool, ARequestPastTheRangeIsRefused) {
  BlockPool pool(size_t{16} << 20);
  const BlockPool::Taken big = pool.take(size_t{17} << 20, 0);
  EXPECT_EQ(big.ptr, nullptr);
  EXPECT_FALSE(big.over_cap);
  const BlockPool::Taken huge = pool.take(SIZE_MAX - 100, 1 << 30);
  EXPECT_EQ(huge.ptr, nullptr);
  EXPECT_TRUE(huge.over_cap);
  EXPECT_EQ(pool.reserved(), 0);
  const BlockPool::Taken fits = pool.take(size_t{16} << 20, 0);
  ASSERT_NE(fits.ptr, nullptr);
  EXPECT_EQ(pool.range_top(), size_t{16} << 20);
  pool.give_back(fits.ptr);
}

// Releases are counted where they give something back, the cap's own
// among them.
TEST(BlockPool, ReleasesAreCounted) {
  BlockPool pool;
  EXPECT_EQ(pool.release(), 0);
  EXPECT_EQ(pool.releases(), 0);
  const BlockPool::Taken a = pool.take(2 * u, 0);
  pool.give_back(a.ptr);
  const BlockPool::Taken b = pool.take(3 * u, 3 * u);  // releases a first
  ASSERT_NE(b.ptr, nullptr);
  EXPECT_EQ(pool.releases(), 1);
  EXPECT_EQ(pool.reserved(), 3 * u);
  pool.give_back(b.ptr);
}

}  // namespace
}  // namespace memtrain::memory
