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

// What this process's job may use: total_host_memory(), or less where a
// memory cgroup limits it (SLURM's --mem, a container): the smallest
// memory.max (cgroup v2) or memory.limit_in_bytes (v1) from the process's
// cgroup up to the root. 0 when unknown.
uint64_t host_memory_limit();

}  // namespace memtrain
