#include "memtrain/dist/environment.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

int parse_int(const char* name, const char* text) {
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  MT_CHECK(
      end != text && v >= 0 && v < (1 << 24),
      "environment variable ",
      name,
      "='",
      text,
      "' is not a non-negative integer");
  return static_cast<int>(v);
}

// SLURM_TASKS_PER_NODE looks like "4(x2),3": tasks on the first node first.
// Without SLURM_NTASKS_PER_NODE we take the first node's count.
int parse_slurm_tasks_per_node(const char* text) {
  return parse_int(
      "SLURM_TASKS_PER_NODE",
      std::string(text)
          .substr(0, std::string(text).find_first_of("(,"))
          .c_str());
}

}  // namespace

LocalRank local_rank_from_env(
    const std::function<const char*(const char*)>& getenv) {
  LocalRank out;
  if (const char* r = getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
    out.local_rank = parse_int("OMPI_COMM_WORLD_LOCAL_RANK", r);
    const char* s = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    out.local_size = s ? parse_int("OMPI_COMM_WORLD_LOCAL_SIZE", s) : 1;
    out.source = "openmpi";
  } else if (const char* r = getenv("SLURM_LOCALID")) {
    out.local_rank = parse_int("SLURM_LOCALID", r);
    if (const char* s = getenv("SLURM_NTASKS_PER_NODE")) {
      out.local_size = parse_int("SLURM_NTASKS_PER_NODE", s);
    } else if (const char* t = getenv("SLURM_TASKS_PER_NODE")) {
      out.local_size = parse_slurm_tasks_per_node(t);
    }
    out.source = "slurm";
  } else if (const char* r = getenv("LOCAL_RANK")) {
    out.local_rank = parse_int("LOCAL_RANK", r);
    const char* s = getenv("LOCAL_WORLD_SIZE");
    out.local_size = s ? parse_int("LOCAL_WORLD_SIZE", s) : 1;
    out.source = "torchrun";
  }
  if (out.local_size < out.local_rank + 1)
    out.local_size = out.local_rank + 1;
  return out;
}

void check_launch_world(
    int mpi_world, const std::function<const char*(const char*)>& getenv) {
  auto count = [&](const char* name) {
    const char* v = getenv(name);
    return v ? parse_int(name, v) : 0;
  };
  const std::string world = std::to_string(mpi_world);
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    const int n = count("OMPI_COMM_WORLD_SIZE");
    MT_CHECK(
        n == mpi_world,
        "mpirun started ",
        n,
        " processes (OMPI_COMM_WORLD_SIZE=",
        n,
        ") but MPI sees a world of ",
        world,
        ": memtrain was built against another MPI than the mpirun that "
        "launched it; launch with the mpirun of the MPI memtrain links "
        "(ldd memtrain | grep libmpi)");
    return;
  }
  const char* slurm =
      getenv("SLURM_STEP_NUM_TASKS") ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS";
  const int n = count(slurm);
  if (n > 0) {
    MT_CHECK(
        n <= mpi_world,
        "SLURM announces ",
        n,
        " tasks (",
        slurm,
        "=",
        n,
        ") but MPI sees a world of ",
        world,
        ": without working PMI each task would train alone, ",
        n,
        " copies writing into one output.dir. Launch with srun --mpi=pmix "
        "(srun --mpi=list shows what this cluster has; "
        "launch/slurm/train.sbatch does), or through mpirun inside the "
        "allocation");
  }
  if (getenv("WORLD_SIZE") &&
      (getenv("TORCHELASTIC_RUN_ID") || getenv("LOCAL_WORLD_SIZE"))) {
    const int copies = count("WORLD_SIZE");
    MT_CHECK(
        copies <= mpi_world,
        "torchrun (or another PyTorch launcher) started ",
        copies,
        " processes (WORLD_SIZE=",
        copies,
        ") but MPI sees a world of ",
        world,
        ": memtrain's ranks are MPI processes; launch with mpirun -np ",
        copies,
        " memtrain train ... (or srun --mpi=pmix)");
  }
}

Environment::Environment(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    owns_mpi_ = true;
  }
  // Errors in MPI calls come back as codes that our check macros turn into
  // exceptions with MPI's own message, instead of MPI aborting silently.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size_);
  local_ = local_rank_from_env([](const char* n) { return std::getenv(n); });
  if (local_.source.empty()) {
    // No launcher variables: ask MPI which ranks share this node.
    MPI_Comm node;
    MPI_Comm_split_type(
        MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local_.local_rank);
    MPI_Comm_size(node, &local_.local_size);
    MPI_Comm_free(&node);
    local_.source = "mpi-shared-memory";
  }
  hostname_ = host_name();
}

Environment::~Environment() {
  if (owns_mpi_) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized)
      MPI_Finalize();
  }
}

void Environment::abort(int status) const {
  MPI_Abort(MPI_COMM_WORLD, status);
  std::_Exit(status);
}

void Environment::set_collective_timeout(double seconds) {
  waiter_.set_timeout(seconds);
}

// Both collectives below are polled against the timeout: a rank stuck
// before them (opening a file on a hung file system, say) must not hang
// the start-up. See Note [Collective timeouts].
bool Environment::all_ok(bool ok, int* first_failing_rank) const {
  const int lowest = waiter_.first_failing_rank(ok, "start-up check");
  if (first_failing_rank)
    *first_failing_rank = lowest;
  return lowest == world_size_;
}

std::vector<std::string> Environment::all_gather(
    const std::string& text) const {
  // Lengths first, then the texts: no width to truncate at.
  int length = static_cast<int>(text.size());
  std::vector<int> lengths(world_size_);
  MPI_Request request;
  MT_MPI_CHECK(
      MPI_Iallgather(
          &length,
          1,
          MPI_INT,
          lengths.data(),
          1,
          MPI_INT,
          MPI_COMM_WORLD,
          &request),
      rank_);
  waiter_.wait(&request, 1, "start-up all-gather", waiter_.next_sequence());
  std::vector<int> offsets(world_size_, 0);
  for (int r = 1; r < world_size_; ++r)
    offsets[r] = offsets[r - 1] + lengths[r - 1];
  std::vector<char> all(
      static_cast<size_t>(offsets.back() + lengths.back()) + 1);
  MT_MPI_CHECK(
      MPI_Iallgatherv(
          text.data(),
          length,
          MPI_CHAR,
          all.data(),
          lengths.data(),
          offsets.data(),
          MPI_CHAR,
          MPI_COMM_WORLD,
          &request),
      rank_);
  waiter_.wait(&request, 1, "start-up all-gather", waiter_.next_sequence());
  std::vector<std::string> out;
  for (int r = 0; r < world_size_; ++r)
    out.emplace_back(&all[offsets[r]], static_cast<size_t>(lengths[r]));
  return out;
}

}  // namespace memtrain
