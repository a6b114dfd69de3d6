#pragma once
// The host plan: what a rank holds in host memory, holder by holder,
// against its host budget (memory.host_budget), charged at start-up and
// refused there with the arithmetic -- not by the kernel's OOM killer in
// the middle of a run (Note [Host plan] in host_plan.cpp).

#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/util/host_memory.h"

namespace memtrain::memory {

// One holder of host memory and the most it holds.
struct HostHolder {
  std::string name;   // "validation", "prefetch", ...
  int64_t bytes = 0;  // the most it holds at once
  std::string how;    // the arithmetic, with the sizes it came from
  std::string lower;  // the keys that lower it ("": none)
};

struct HostPlan {
  int64_t budget = 0;       // this rank's host budget, bytes
  std::string budget_note;  // how it was chosen
  std::vector<HostHolder> holders;

  int64_t charged() const;  // the holders' sum
};

// The margin memory.host_budget=auto keeps off the job's memory for what
// the node charges the job outside its ranks' own holders (MPI's shared
// segments, the launcher, files written): 5% of it, at least 256 MiB, at
// most half.
int64_t host_margin_bytes(uint64_t job_bytes);

// memory.host_budget as bytes: `spec` ("auto" or a size, budget.h's
// parse_memory_size forms) for a rank that shares its node, whose job may
// use `job` (util/host_memory.h; bytes 0: unknown), with `local_ranks`
// ranks. auto: the job's memory less host_margin_bytes, shared out by its
// ranks. `why` gets how it was chosen, the job's limit named by its source
// and any limit file that could not be read; where blocks are pinned
// (`pinned`) and `memlock_bytes` (`ulimit -l`, -1: unlimited) is below the
// budget, it says so: CUDA pins through its driver, not mlock, so that
// limit is reported, not applied.
int64_t host_budget_bytes(
    const std::string& spec,
    const JobMemory& job,
    int local_ranks,
    bool pinned,
    int64_t memlock_bytes,
    std::string* why);

// RLIMIT_MEMLOCK's soft limit in bytes, -1 for unlimited.
int64_t memlock_limit();

// One line: the budget, each holder's bytes, what is left.
std::string describe(const HostPlan& plan);

// The refusal of a plan whose holders pass its budget, for rank `rank`:
// the budget and how it was chosen, every holder largest first with its
// arithmetic and the keys that lower it, and "give the job more memory".
// "" when the plan fits.
std::string refusal(const HostPlan& plan, int rank);

}  // namespace memtrain::memory
