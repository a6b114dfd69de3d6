#include "memtrain/memory/host_figures.h"

#include <malloc.h>
#include <unistd.h>

#include <cstdio>

#include "memtrain/memory/device_memory.h"

namespace memtrain::memory {

// Note [Host figures]
// The resident set is the truth the kernel (and a cgroup's memory.max)
// holds a process to. Its parts, as this file reads them:
// - rss_file: pages backed by files or shared -- the code and data of the
//   ~300 libraries LibTorch loads, and MPI's shared-memory segments.
//   Constant after start-up, but for the kernels first run later.
// - counted: the accounting allocator's bytes (accounting_allocator.cpp):
//   the device domain's segments (mapped by the block pool, its cached
//   blocks included) and the host domain's blocks (glibc's).
// - glibc's other allocations (malloc_used - the host domain): LibTorch's
//   operator tables, HDF5's chunk caches, MPI's free lists, oneDNN's
//   primitive caches.
// - malloc_free: what glibc keeps after free(), in its arenas (brk heap and
//   thread arenas); resident where it was touched, until trimmed.
// - the rest: thread stacks, JIT-compiled kernels, untouched padding.
// /proc/self/statm is counters; mallinfo2() walks glibc's free lists, so
// its cost grows with the free chunks. Measured with a C program that
// mallocs 2N chunks of 200-300 bytes and frees every other one (median of
// 9 calls; dev VM, 2 cores, a build on the other core): 2 us for 500 free
// chunks, 63 us for 5 000, 1.5 ms for 50 000, 38 ms for 500 000. Once per
// window, against windows of seconds, both are read at every boundary.

HostFigures read_host_figures() {
  HostFigures f;
  if (std::FILE* in = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0, shared = 0;
    if (std::fscanf(in, "%llu %llu %llu", &size, &resident, &shared) == 3) {
      const long page = ::sysconf(_SC_PAGESIZE);
      f.rss = static_cast<int64_t>(resident) * page;
      f.rss_file = static_cast<int64_t>(shared) * page;
    }
    std::fclose(in);
  }
  if (std::FILE* in = std::fopen("/proc/self/status", "r")) {
    char line[256];
    unsigned long long kib = 0;
    while (std::fgets(line, sizeof(line), in)) {
      if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) {
        f.rss_peak = static_cast<int64_t>(kib) * 1024;
        break;
      }
    }
    std::fclose(in);
  }
  const struct mallinfo2 mi = ::mallinfo2();
  f.malloc_used = static_cast<int64_t>(mi.uordblks + mi.hblkhd);
  f.malloc_free = static_cast<int64_t>(mi.fordblks);
  if (accounting_installed()) {
    const Stats s = stats();
    f.counted = s.reserved + s.host_allocated;
    f.counted_host = s.host_allocated;
  }
  return f;
}

void trim_host_heap() {
  ::malloc_trim(0);
}

}  // namespace memtrain::memory
