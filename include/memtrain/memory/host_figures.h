#pragma once
// Host figures: what this process holds in host memory, and who holds it
// (Note [Host figures] in host_figures.cpp). Read at every window boundary
// into metrics.jsonl; the ground truth a host budget is held to.

#include <cstdint>

namespace memtrain::memory {

struct HostFigures {
  int64_t rss = 0;       // resident set (/proc/self/statm)
  int64_t rss_file = 0;  // of it, file-backed and shared pages: the
                         // libraries' code and data, shared memory
  int64_t rss_peak = 0;  // the largest resident set so far (VmHWM; the
                         // kernel syncs it with per-thread counters, so it
                         // can trail rss by a few pages)
  // What memtrain counts in host memory: on the CPU device the accounting
  // allocator's device domain (reserved, its cache included) and host
  // domain (allocated); 0 where it is not installed (CUDA).
  int64_t counted = 0;
  int64_t counted_host = 0;  // of it, the host domain's (glibc's blocks)
  int64_t malloc_used = 0;   // glibc: bytes in use, in arenas and mmapped
                             // chunks (the counted host blocks among them)
  int64_t malloc_free = 0;   // glibc: free bytes kept in its arenas
};

HostFigures read_host_figures();

// Returns glibc's free pages to the kernel (malloc_trim).
void trim_host_heap();

}  // namespace memtrain::memory
