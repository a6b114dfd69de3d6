#include "memtrain/dist/cpu_threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <set>
#include <sstream>

#include "memtrain/dist/environment.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Threads per rank]
// ~~~~~~~~~~~~~~~~~~~~~~~
// A rank's share of the CPU is what its launcher gave it, not the machine:
//
//   share   = CPUs in the affinity mask / local ranks whose masks overlap it
//   share   = min(share, SLURM_CPUS_PER_TASK)      when that is set
//   threads = min(OMP_NUM_THREADS, share)          when that is set
//   threads = share                                otherwise (at least 1)
//
// `mpirun -np 2` on 2 cores binds each rank to one core: masks of 1 CPU that
// do not overlap, 1 thread each. Unbound ranks (Open MPI when
// oversubscribed, `--bind-to none`, a plain `srun` without binding) all see
// the whole machine: their masks overlap, so the mask is divided among them.
// `srun --cpus-per-task=8` binds a mask of 8 CPUs; SLURM_CPUS_PER_TASK caps
// the share where the cluster does not bind. OMP_NUM_THREADS is honoured
// downwards only: a rank never runs more threads than its share, so an
// exported OMP_NUM_THREADS=16 cannot oversubscribe 4 ranks on 16 cores.
// hardware_concurrency() is never asked: it counts the machine's cores,
// which a rank of a shared node does not own.
//
// The count goes to LibTorch's intra-op pool and to OpenBLAS, which starts
// a pool of its own the size of the machine when loaded and would otherwise
// use it for every matrix product, in every rank.

ThreadPlan plan_threads(const ThreadInputs& in) {
  const int sharers = std::max(1, in.ranks_sharing_mask);
  int share = std::max(1, in.mask_cpus / sharers);
  std::ostringstream why;
  why << in.mask_cpus << " CPU(s) in the affinity mask";
  if (sharers > 1)
    why << " shared by " << sharers << " local ranks";
  if (in.slurm_cpus_per_task && *in.slurm_cpus_per_task < share) {
    share = std::max(1, *in.slurm_cpus_per_task);
    why << ", SLURM_CPUS_PER_TASK=" << *in.slurm_cpus_per_task;
  }
  ThreadPlan plan;
  plan.threads = share;
  if (in.omp_num_threads) {
    const int asked = std::max(1, *in.omp_num_threads);
    plan.threads = std::min(asked, share);
    why << ", OMP_NUM_THREADS=" << *in.omp_num_threads;
    if (asked > share)
      why << " capped to the share";
  }
  plan.reason = why.str();
  return plan;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::vector<int> c(cpus);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  std::ostringstream out;
  for (size_t i = 0; i < c.size();) {
    size_t j = i;
    while (j + 1 < c.size() && c[j + 1] == c[j] + 1)
      ++j;
    out << (i ? "," : "") << c[i];
    if (j > i)
      out << "-" << c[j];
    i = j + 1;
  }
  return out.str();
}

std::vector<int> parse_cpu_list(const std::string& text) {
  std::vector<int> cpus;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, ',');) {
    int lo = 0, hi = 0;
    char dash = 0;
    std::istringstream p(part);
    MT_CHECK(static_cast<bool>(p >> lo), "CPU list '", text, "' is malformed");
    hi = lo;
    if (p >> dash)
      MT_CHECK(
          dash == '-' && (p >> hi) && hi >= lo,
          "CPU list '",
          text,
          "' is malformed");
    MT_CHECK(lo >= 0, "CPU list '", text, "' is malformed");
    for (int c = lo; c <= hi; ++c)
      cpus.push_back(c);
  }
  return cpus;
}

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0)
    return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set))
      cpus.push_back(c);
  return cpus;
}

int ranks_sharing(
    const std::string& host,
    const std::vector<int>& mine,
    const std::vector<std::string>& peers) {
  const std::set<int> own(mine.begin(), mine.end());
  int sharing = 0;
  for (const auto& p : peers) {
    const auto bar = p.find('|');
    if (bar == std::string::npos || p.substr(0, bar) != host)
      continue;
    std::vector<int> theirs;
    try {
      theirs = parse_cpu_list(p.substr(bar + 1));
    } catch (const Error&) {
      ++sharing;  // truncated by all_gather's width: assume the worst
      continue;
    }
    if (std::any_of(theirs.begin(), theirs.end(), [&](int c) {
          return own.count(c) > 0;
        }))
      ++sharing;
  }
  return std::max(1, sharing);
}

namespace {

std::optional<int> positive_env(const char* name) {
  const char* text = std::getenv(name);
  if (!text || !*text)
    return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  // OMP_NUM_THREADS may list nested levels ("4,2"): the first is ours.
  MT_CHECK(
      end != text && (*end == '\0' || *end == ',') && v >= 1 && v <= INT_MAX,
      "environment variable ",
      name,
      "='",
      text,
      "' is not a positive integer; unset it to let memtrain use the CPUs "
      "of this rank's affinity mask (Note [Threads per rank])");
  return static_cast<int>(v);
}

}  // namespace

ThreadInputs read_thread_inputs(const Environment& env) {
  const auto mine = affinity_cpus();
  ThreadInputs in;
  in.mask_cpus = std::max<int>(1, static_cast<int>(mine.size()));
  const auto peers =
      env.all_gather(env.hostname() + "|" + format_cpu_list(mine));
  in.ranks_sharing_mask = ranks_sharing(env.hostname(), mine, peers);
  in.omp_num_threads = positive_env("OMP_NUM_THREADS");
  in.slurm_cpus_per_task = positive_env("SLURM_CPUS_PER_TASK");
  return in;
}

BlasInfo loaded_blas() {
  BlasInfo info;
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  Dl_info where{};
  if (sgemm && dladdr(sgemm, &where) && where.dli_fname) {
    info.library = where.dli_fname;
    if (char* real = realpath(where.dli_fname, nullptr)) {
      info.library = real;
      std::free(real);
    }
  }
  using ConfigFn = char* (*)();
  using ThreadsFn = int (*)();
  if (auto f = reinterpret_cast<ConfigFn>(
          dlsym(RTLD_DEFAULT, "openblas_get_config")))
    info.config = f();
  if (auto f = reinterpret_cast<ThreadsFn>(
          dlsym(RTLD_DEFAULT, "openblas_get_num_threads")))
    info.threads = f();
  return info;
}

ThreadPlan configure_cpu_threads(const Environment& env) {
  const ThreadPlan plan = plan_threads(read_thread_inputs(env));
  at::set_num_threads(plan.threads);
  using SetFn = void (*)(int);
  if (auto f = reinterpret_cast<SetFn>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    f(plan.threads);
  return plan;
}

}  // namespace memtrain
