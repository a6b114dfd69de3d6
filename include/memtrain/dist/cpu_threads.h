#pragma once
// CPU threads per rank, and which BLAS does the fp32 matrix products.
// See Note [Threads per rank] in src/dist/cpu_threads.cpp.

#include <optional>
#include <string>
#include <vector>

namespace memtrain {

class Environment;

// What decides a rank's thread count. Filled by read_thread_inputs from the
// process's affinity mask, its peers' masks and the environment; built by
// hand in tests.
struct ThreadInputs {
  int mask_cpus = 1;                   // CPUs in this process's affinity mask
  int ranks_sharing_mask = 1;          // local ranks (this one too) whose masks
                                       // overlap this rank's
  std::optional<int> omp_num_threads;  // OMP_NUM_THREADS, if set
  std::optional<int> slurm_cpus_per_task;  // SLURM_CPUS_PER_TASK, if set
};

struct ThreadPlan {
  int threads = 1;
  std::string reason;  // one line for the banner and environment.json
};

// The rule, without side effects: see Note [Threads per rank].
ThreadPlan plan_threads(const ThreadInputs& in);

// "0-3,8,10-11" <-> {0,1,2,3,8,10,11}. parse_cpu_list throws
// memtrain::Error on malformed text.
std::string format_cpu_list(const std::vector<int>& cpus);
std::vector<int> parse_cpu_list(const std::string& text);

// The CPUs this process may run on (sched_getaffinity).
std::vector<int> affinity_cpus();

// Counts the local ranks whose CPU lists overlap `mine`. `peers` are
// "host|cpu-list" entries of every rank (this one included); only those
// of `host` count. An entry whose list cannot be read counts as sharing.
int ranks_sharing(
    const std::string& host,
    const std::vector<int>& mine,
    const std::vector<std::string>& peers);

// Collective over the world (Environment::all_gather): the inputs of this
// rank. Throws memtrain::Error on a malformed OMP_NUM_THREADS or
// SLURM_CPUS_PER_TASK.
ThreadInputs read_thread_inputs(const Environment& env);

// The BLAS library LibTorch's CPU matrix products reach: the shared object
// that provides sgemm_ (its real path, through the libblas.so.3
// alternative), and OpenBLAS's build string when it is OpenBLAS.
struct BlasInfo {
  std::string library;  // "" when no sgemm_ is loaded
  std::string config;   // openblas_get_config(), or ""
  int threads = 0;      // openblas_get_num_threads(), 0 when not OpenBLAS
};
BlasInfo loaded_blas();

// Collective: plans this rank's threads and applies them to LibTorch's
// intra-op pool and to OpenBLAS (whose own pool otherwise takes every core
// of the machine in every rank). Call once, before the first tensor op.
ThreadPlan configure_cpu_threads(const Environment& env);

}  // namespace memtrain
