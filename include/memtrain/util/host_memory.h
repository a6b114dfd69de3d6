#pragma once
// How much host memory there is to take, for limits named before they are
// hit (a grid, a declared dataset) rather than discovered as std::bad_alloc.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace memtrain {

// The host memory available now (MemAvailable of /proc/meminfo, else the
// free pages), in bytes; 0 when unknown.
uint64_t available_host_memory();

// The machine's physical memory, in bytes; 0 when unknown.
uint64_t total_host_memory();

// What this process's job may use on its node, and where that came from.
struct JobMemory {
  uint64_t bytes = 0;  // 0: unknown
  // The limit that set `bytes`, as a user would check it:
  // "cgroup memory.max of /system.slice/job_12 (/sys/fs/cgroup/...)",
  // "SLURM_MEM_PER_NODE=4096 (MiB)", "physical memory".
  std::string source;
  // Limit files that exist but could not be read as a number: reported
  // (the banner), never taken as "no limit" silently.
  std::vector<std::string> unreadable;
};

// The smallest of: the machine's memory (`physical`), every memory cgroup
// limit from the process's cgroup up to the root -- memory.max (v2) or
// memory.limit_in_bytes (v1), as listed in `proc_cgroup` and found under
// `cgroup_root` -- and what SLURM declares for this node
// (SLURM_MEM_PER_NODE; SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE;
// SLURM_MEM_PER_GPU x SLURM_GPUS_ON_NODE; MiB). Under SLURM with cgroup
// enforcement the cgroup's limit is what the kernel holds the job to, the
// variables what was asked for. The paths and `getenv` are injectable for
// tests. Throws memtrain::Error naming a SLURM variable that is not a
// number.
JobMemory job_memory(
    uint64_t physical,
    const std::string& proc_cgroup,
    const std::string& cgroup_root,
    const std::function<const char*(const char*)>& getenv);

// job_memory() of this process (/proc/self/cgroup, /sys/fs/cgroup, its
// environment).
JobMemory job_memory();

// job_memory().bytes.
uint64_t host_memory_limit();

}  // namespace memtrain
