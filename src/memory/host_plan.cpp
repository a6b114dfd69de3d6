#include "memtrain/memory/host_plan.h"

#include <sys/resource.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "memtrain/memory/budget.h"
#include "memtrain/util/error.h"

namespace memtrain::memory {

// Note [Host plan]
// The kernel (a cgroup's memory.max: SLURM's --mem, a container) holds a
// process to its resident set, and kills it without a message when the
// set passes the limit. Every rank's holders of host memory are charged
// at start-up, after planning, when the micro-batch and the tier are
// known:
// - outside: what the process holds beyond the holders below, measured
//   then (resident set - counted bytes): the libraries' code and data,
//   LibTorch's and HDF5's own heaps, glibc's retention, the kernels the
//   probes loaded;
// - the CPU device (CPU runs only): the device domain's cap
//   (memory.budget), or the plan's peak without one;
// - the offload pool: the tier's host bytes, as its probe measured them;
// - validation: the largest case's host tensors (the task's formula);
// - prefetch: the training loader's batches at their bound;
// - HDF5's chunk caches of the open datasets.
// memory.host_budget=auto is the job's memory (util/host_memory.h:
// job_memory -- the least of the node's, its cgroup's and SLURM's) less a
// margin, shared out by the node's ranks. Before planning, the CPU
// device's cap comes down to what the other holders leave (so that the
// device domain runs out, which the planner and the replay handle, before
// the host does) and the offload pool is capped at what is left; after
// planning the cap is fitted again, above the plan's peak and the
// headroom's slack. A plan whose
// holders pass the budget is refused before the first window, on every
// rank, with each holder's arithmetic (train/loop/host_planning.cpp).

int64_t HostPlan::charged() const {
  return std::accumulate(
      holders.begin(), holders.end(), int64_t{0}, [](int64_t s, const auto& h) {
        return s + h.bytes;
      });
}

int64_t host_margin_bytes(uint64_t job_bytes) {
  const auto job = static_cast<int64_t>(job_bytes);
  return std::min(std::max(job / 20, int64_t{256} << 20), job / 2);
}

int64_t host_budget_bytes(
    const std::string& spec,
    const JobMemory& job,
    int local_ranks,
    bool pinned,
    int64_t memlock_bytes,
    std::string* why) {
  int64_t bytes = 0;
  std::string how;
  if (spec != "auto") {
    bytes = parse_memory_size(spec);
    how = "memory.host_budget=" + spec;
  } else {
    MT_CHECK(
        job.bytes > 0,
        "memory.host_budget=auto: this machine's memory size is unknown; "
        "set memory.host_budget to a size (e.g. 16GiB)");
    const int ranks = std::max(1, local_ranks);
    const int64_t margin = host_margin_bytes(job.bytes);
    bytes = (static_cast<int64_t>(job.bytes) - margin) / ranks;
    how = detail::concat(
        "auto: ",
        format_bytes(static_cast<double>(job.bytes)),
        " (",
        job.source,
        ") less a margin of ",
        format_bytes(static_cast<double>(margin)),
        ", over ",
        ranks,
        ranks == 1 ? " rank" : " ranks",
        " on this node");
  }
  for (const std::string& u : job.unreadable)
    how += "; not read: " + u;
  // CUDA pins through its driver (cudaHostAlloc), not mlock(), so
  // RLIMIT_MEMLOCK is reported, not applied (not checked on a GPU): a
  // block that cannot be pinned is an error naming both
  // (cuda_offload.cpp).
  if (pinned && memlock_bytes >= 0 && memlock_bytes < bytes) {
    how += detail::concat(
        "; ulimit -l is ",
        format_bytes(static_cast<double>(memlock_bytes)),
        ", below it (CUDA pins through its driver, not mlock: not "
        "applied)");
  }
  if (why)
    *why = how;
  return bytes;
}

int64_t memlock_limit() {
  rlimit r{};
  if (getrlimit(RLIMIT_MEMLOCK, &r) != 0 || r.rlim_cur == RLIM_INFINITY)
    return -1;
  return static_cast<int64_t>(r.rlim_cur);
}

std::string describe(const HostPlan& plan) {
  std::ostringstream out;
  out << "host plan: budget " << format_bytes(static_cast<double>(plan.budget))
      << " (" << plan.budget_note << ")";
  for (const HostHolder& h : plan.holders) {
    out << "; " << h.name << " " << format_bytes(static_cast<double>(h.bytes));
  }
  out << "; left "
      << format_bytes(static_cast<double>(plan.budget - plan.charged()));
  return out.str();
}

std::string refusal(const HostPlan& plan, int rank) {
  if (plan.charged() <= plan.budget)
    return "";
  std::vector<HostHolder> by_size = plan.holders;
  std::stable_sort(
      by_size.begin(), by_size.end(), [](const auto& a, const auto& b) {
        return a.bytes > b.bytes;
      });
  std::ostringstream out;
  out << "rank " << rank << " would hold "
      << format_bytes(static_cast<double>(plan.charged()))
      << " of host memory, more than its host budget of "
      << format_bytes(static_cast<double>(plan.budget)) << " ("
      << plan.budget_note << "):";
  for (const HostHolder& h : by_size) {
    out << "\n  " << h.name << " " << format_bytes(static_cast<double>(h.bytes))
        << ": " << h.how;
    if (!h.lower.empty())
      out << " (lower it with " << h.lower << ")";
  }
  out << "\nlower the largest holders as named, or give the job more "
         "memory (SLURM's --mem, fewer ranks a node, or memory.host_budget "
         "where it is set below the job's)";
  return out.str();
}

}  // namespace memtrain::memory
