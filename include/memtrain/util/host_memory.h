#pragma once
// How much host memory there is to take, for limits named before they are
// hit (a grid, a declared dataset) rather than discovered as std::bad_alloc.

#include <cstdint>

namespace memtrain {

// The host memory available now (MemAvailable of /proc/meminfo, else the
// free pages), in bytes; 0 when unknown.
uint64_t available_host_memory();

// The machine's physical memory, in bytes; 0 when unknown.
uint64_t total_host_memory();

}  // namespace memtrain
