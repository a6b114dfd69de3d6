// memory/host_figures.h: the process's resident set and what memtrain
// counts of it, read as the kernel and glibc report them.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_figures.h"

namespace memtrain {
namespace {

// 64 MiB through the accounting allocator's device domain: counted exactly
// (a multiple of the block pool's page), resident once written, not
// glibc's (the block pool maps its segments itself), and given back to the
// kernel when the cache is released.
TEST(HostFigures, SeeTheResidentSetAndTheCountedBytes) {
  ASSERT_TRUE(memory::accounting_installed());
  memory::release_cache();
  constexpr int64_t kBytes = int64_t{64} << 20;
  const memory::HostFigures before = memory::read_host_figures();
  EXPECT_GT(before.rss_file, 0);
  EXPECT_GT(before.rss, before.rss_file);
  torch::Tensor t;
  {
    memory::DeviceScope device;
    t = torch::ones({kBytes / 4});
  }
  const memory::HostFigures held = memory::read_host_figures();
  EXPECT_EQ(held.counted - before.counted, kBytes);
  EXPECT_LT(held.malloc_used - before.malloc_used, int64_t{1} << 20);
  EXPECT_GE(held.rss - before.rss, kBytes - (int64_t{2} << 20));
  t = torch::Tensor();
  const memory::HostFigures cached = memory::read_host_figures();
  EXPECT_EQ(cached.counted, held.counted) << "freed into the cache: reserved";
  EXPECT_EQ(memory::release_cache(), kBytes);
  const memory::HostFigures released = memory::read_host_figures();
  EXPECT_EQ(released.counted, before.counted);
  EXPECT_LE(released.rss, held.rss - kBytes + (int64_t{2} << 20));
  // The peak remembers what was held (the kernel's per-thread counters may
  // lag statm by a few pages: 88 KiB measured).
  EXPECT_GE(released.rss_peak, held.rss - (int64_t{1} << 20));
  EXPECT_GE(held.rss_peak, held.rss - (int64_t{1} << 20));
}

}  // namespace
}  // namespace memtrain
