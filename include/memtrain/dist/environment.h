#pragma once
// Environment: who am I and where do I run. Initialises MPI once per process
// (thread level FUNNELED: only the main thread calls MPI), reads the world
// from MPI and the node-local rank from the launcher's variables.

#include <functional>
#include <string>
#include <vector>

#include "memtrain/dist/mpi_wait.h"

namespace memtrain {

struct LocalRank {
  int local_rank = 0;
  int local_size = 1;
  std::string source;  // which variables it came from, for the launch banner
};

// Reads the node-local rank and size from the launcher's variables, in this
// order: Open MPI (OMPI_COMM_WORLD_LOCAL_RANK/_SIZE), SLURM (SLURM_LOCALID;
// this node's entry, by SLURM_NODEID, of SLURM_STEP_TASKS_PER_NODE or
// SLURM_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE), torchrun-style
// (LOCAL_RANK, LOCAL_WORLD_SIZE). Returns
// source "" when none is set. `getenv` is injectable for tests. Throws
// memtrain::Error on a malformed value.
LocalRank local_rank_from_env(
    const std::function<const char*(const char*)>& getenv);

// SLURM_TASKS_PER_NODE's count for node `node_id` (SLURM_NODEID, 0-based):
// the value lists the nodes' task counts in node order, a run of equal
// counts written "C(xR)" — "2(x2)" is 2,2; "3,1"; "4(x2),3" is 4,4,3.
// Throws memtrain::Error naming the value when it is malformed or lists
// fewer nodes than `node_id` + 1.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node_id);

// Where the ranks run: nodes are the distinct host names, numbered in the
// order of their lowest rank.
struct NodeLayout {
  std::vector<std::string> hosts;   // by rank
  std::vector<int> node_of_rank;    // by rank: its node's index
  std::vector<int> ranks_per_node;  // by node index
  int node_count() const {
    return static_cast<int>(ranks_per_node.size());
  }
  // "1 node × 2 ranks", "2 nodes × 2 ranks", "2 nodes: 3+1 ranks".
  std::string describe() const;
  // "rank(s) 2, 3 on node2" for a list of ranks, grouped by host.
  std::string name_ranks(const std::vector<int>& ranks) const;
};
NodeLayout node_layout(const std::vector<std::string>& host_by_rank);

// This process's executable, identified by its contents: "memtrain 0.1.0,
// build id <hex>" from the GNU build id the linker wrote into it, or, in
// an executable without one, "<size> bytes, digest <hex>" (a 64-bit FNV-1a
// of /proc/self/exe). Two nodes that run different builds under one name
// differ here.
std::string executable_identity();

// Whether the launcher started the processes MPI sees as one world.
// Throws memtrain::Error with the fix when a launcher announces more tasks
// than `mpi_world` (each process then a world of its own): `srun` without
// working PMI (SLURM_STEP_NUM_TASKS, else SLURM_NTASKS), `mpirun`
// (OMPI_COMM_WORLD_SIZE) or `torchrun` (WORLD_SIZE with TORCHELASTIC_RUN_ID
// or LOCAL_WORLD_SIZE). Processes of `mpirun` inside an allocation
// (OMPI_COMM_WORLD_SIZE set) are judged by Open MPI's count alone: fewer
// ranks than the allocation's tasks is a choice. `getenv` is injectable for
// tests.
void check_launch_world(
    int mpi_world, const std::function<const char*(const char*)>& getenv);

class Environment {
 public:
  // Initialises MPI if nobody has; finalises it in the destructor if it did.
  Environment(int* argc, char*** argv);
  ~Environment();
  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;

  int rank() const {
    return rank_;
  }
  int world_size() const {
    return world_size_;
  }
  int local_rank() const {
    return local_.local_rank;
  }
  int local_size() const {
    return local_.local_size;
  }
  const std::string& local_rank_source() const {
    return local_.source;
  }
  const std::string& hostname() const {
    return hostname_;
  }
  // Every rank's host and the nodes they form (gathered at start-up).
  const NodeLayout& nodes() const {
    return nodes_;
  }
  int node_index() const {
    return nodes_.node_of_rank[static_cast<size_t>(rank_)];
  }
  // Ends every rank of the job now (MPI_Abort). For a failure after ranks
  // started exchanging data, so no peer waits forever.
  [[noreturn]] void abort(int status) const;

  // Seconds a collective of all_ok / all_gather may wait for its peers
  // before the job ends, naming the ranks that did not arrive (Note
  // [Collective timeouts]); 0 waits forever. Until set: 600 s, the default
  // of dist.timeout_s, which is not known before the config is read.
  void set_collective_timeout(double seconds);
  double collective_timeout() const {
    return waiter_.timeout_s();
  }

  // Collective over MPI_COMM_WORLD, blocking within the collective timeout:
  // true on every rank when every rank passed `ok`. `first_failing_rank`
  // receives the lowest rank that failed (the world size when none did), so
  // one rank can print the job's one error line and the others exit quietly
  // with the same status.
  bool all_ok(bool ok, int* first_failing_rank) const;

  // Collective, blocking within the collective timeout: every rank's `text`, by
  // rank.
  std::vector<std::string> all_gather(const std::string& text) const;

 private:
  static constexpr double kDefaultTimeoutS = 600.0;

  // Mutable: the collectives are const (a question to the job), but they
  // number themselves for the timeout messages.
  mutable MpiWaiter waiter_{MPI_COMM_WORLD, kDefaultTimeoutS};
  bool owns_mpi_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  LocalRank local_;
  std::string hostname_;
  NodeLayout nodes_;
};

// Collective: refuses (memtrain::Error on every rank) when the ranks hold
// different `mine` values, naming the ranks and hosts of each value:
// "SUBJECT: ranks 0, 1 on node1 VERB A; ranks 2, 3 on node2 VERB B. FIX".
void check_same_on_every_rank(
    const Environment& env,
    const std::string& mine,
    const std::string& subject,
    const std::string& verb,
    const std::string& fix);

// Collective: refuses when the ranks run different builds of memtrain.
void check_same_build(const Environment& env);

}  // namespace memtrain
