#include "memtrain/dist/mpi_wait.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "memtrain/dist/environment.h"
#include "memtrain/util/clock.h"

namespace memtrain {

// Note [Collective timeouts]
// MPI has no timeout on a collective: a rank that died or hangs (stuck in a
// read from a hung file system, stopped, spinning) leaves its peers waiting
// forever, unless mpirun notices first, as it does for a killed process.
// So every collective memtrain issues over MPI (but the node split in
// Environment's constructor, before anything could hang) is the
// non-blocking form, polled by MpiWaiter::wait until it completes or the
// timeout passes: the start-up agreement and gathers in Environment
// (all_ok, all_gather; 600 s, dist.timeout_s's default, until cmd_train
// sets dist.timeout_s once the config is agreed), make_communicator's
// backend agreement and every MpiCommunicator collective (dist.timeout_s;
// the clock starts when the caller waits, not when an asynchronous
// collective is issued), and the MPI steps of NcclCommunicator's start (the
// device table, the ncclUniqueId broadcast). NcclCommunicator polls its
// start, its enqueues and its collectives' completion events together with
// NCCL's asynchronous error against the same timeout; on timeout it aborts
// the NCCL communicator and comes here.
//
// On timeout each waiting rank sends rank 0 the number of the collective it
// is stuck in (point-to-point on the same communicator, tag kArrivalTag) and
// prints its own line; rank 0 collects reports for kReportSeconds, names
// the ranks that never reported (dead or hung: they are not waiting in any
// collective), and calls MPI_Abort; the other ranks give it
// 2 x kReportSeconds to do so, then call MPI_Abort themselves. A rank that
// reaches its timeout more than kReportSeconds after rank 0 (it entered the
// collective that much later) is named too. If rank 0 is the stuck one,
// nobody collects: the other ranks' lines say so. The last complete
// checkpoint is untouched: checkpoints are written whole or not at all.

namespace {

constexpr int kArrivalTag = 7401;
constexpr double kReportSeconds = 3.0;

std::vector<std::string>& rank_hosts() {
  static std::vector<std::string> hosts;
  return hosts;
}

// "ranks 2, 3 on node2" for ranks of `comm`, named by their world ranks
// and hosts (ranks alone before set_rank_hosts: NodeLayout lists ranks it
// has no host for).
std::string name_missing(MPI_Comm comm, const std::vector<int>& missing) {
  if (missing.empty())
    return "(none identified)";
  std::vector<int> world(missing.size(), MPI_UNDEFINED);
  MPI_Group mine = MPI_GROUP_NULL;
  MPI_Group all = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &mine);
  MPI_Comm_group(MPI_COMM_WORLD, &all);
  MPI_Group_translate_ranks(
      mine,
      static_cast<int>(missing.size()),
      missing.data(),
      all,
      world.data());
  MPI_Group_free(&mine);
  MPI_Group_free(&all);
  return node_layout(rank_hosts()).name_ranks(world);
}

}  // namespace

void set_rank_hosts(std::vector<std::string> hosts) {
  rank_hosts() = std::move(hosts);
}

MpiWaiter::MpiWaiter(MPI_Comm comm, double timeout_s)
    : comm_(comm), timeout_s_(timeout_s) {
  MT_INTERNAL_ASSERT(timeout_s >= 0, "a timeout is >= 0 s (0: none)");
}

void MpiWaiter::set_timeout(double seconds) {
  MT_INTERNAL_ASSERT(seconds >= 0, "a timeout is >= 0 s (0: none)");
  timeout_s_ = seconds;
}

int MpiWaiter::rank() const {
  int r = 0;
  MPI_Comm_rank(comm_, &r);
  return r;
}

bool MpiWaiter::test(MPI_Request* requests, int count) const {
  int done = 0;
  MT_MPI_CHECK(
      MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), rank());
  return done != 0;
}

void MpiWaiter::wait(
    MPI_Request* requests,
    int count,
    const char* what,
    int64_t sequence,
    const std::function<void()>& between) const {
  // Non-blocking collectives (libnbc) advance only inside MPI calls: each
  // step of a large all-reduce waits for the next test. So poll without
  // sleeping, as a blocking MPI call busy-polls: for 50 us without a pause
  // (a peer microseconds behind: a small sum ends here), then yielding the
  // core to any other runnable process up to a second; past that a peer is
  // far behind, and a millisecond between polls costs nothing. A shared
  // core needs the yield: two ranks of a node on one CPU (2 emulated nodes
  // of one CPU each, benchmarks/multinode_allreduce.sh, 10 Gbit/s) summed
  // 64 MiB in 660 ms when each first polled 10 ms without yielding (every
  // barrier of the node-local phases waited out the other's time slice),
  // in 137 ms yielding after 50 us; 2 ranks on 2 cores of one node summed
  // 4 KiB-1 MiB as before, within this VM's noise. Sleeping 100 us between
  // polls from the start made a 64 KiB all-reduce of 2 ranks on the 2-core
  // development machine, while a build shared it, 9.5x slower than
  // MPI_Allreduce (bench_allreduce: 289 us against 30 us).
  constexpr double kSpinSeconds = 50e-6;
  constexpr double kYieldSeconds = 1.0;
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (test(requests, count))
      return;
    if (between)
      between();
    const double waited = seconds_since(start);
    if (timeout_s_ > 0 && waited > timeout_s_)
      timed_out(what, sequence);
    if (waited < kSpinSeconds)
      continue;
    if (waited < kYieldSeconds)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void MpiWaiter::timed_out(const char* what, int64_t sequence) const {
  const std::string host = host_name();
  const int me = rank();
  int size = 1;
  MPI_Comm_size(comm_, &size);
  const long long seq = static_cast<long long>(sequence);
  if (me != 0) {
    // Tell rank 0 where this rank is stuck; give it time to name the
    // missing ranks before the job ends.
    MPI_Request r;
    MPI_Isend(&seq, 1, MPI_LONG_LONG, 0, kArrivalTag, comm_, &r);
    std::fprintf(
        stderr,
        "memtrain: [rank %d, %s] error: %s #%lld did not complete "
        "within dist.timeout_s=%g s; rank 0 names the rank(s) that "
        "did not arrive (if rank 0 itself is gone, it is the one)\n",
        me,
        host.c_str(),
        what,
        seq,
        timeout_s_);
    std::fflush(stderr);
    const auto start = std::chrono::steady_clock::now();
    while (seconds_since(start) < 2 * kReportSeconds) {
      int sent = 0;
      MPI_Test(&r, &sent, MPI_STATUS_IGNORE);  // progress for the report
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } else {
    std::vector<bool> reported(static_cast<size_t>(size), false);
    reported[0] = true;
    const auto start = std::chrono::steady_clock::now();
    while (seconds_since(start) < kReportSeconds) {
      int flag = 0;
      MPI_Status status;
      MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, comm_, &flag, &status);
      if (flag) {
        long long theirs = 0;
        MPI_Recv(
            &theirs,
            1,
            MPI_LONG_LONG,
            status.MPI_SOURCE,
            kArrivalTag,
            comm_,
            MPI_STATUS_IGNORE);
        reported[static_cast<size_t>(status.MPI_SOURCE)] = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    std::vector<int> missing;
    for (int r = 0; r < size; ++r) {
      if (!reported[static_cast<size_t>(r)])
        missing.push_back(r);
    }
    std::fprintf(
        stderr,
        "memtrain: [rank 0, %s] error: %s #%lld did not complete "
        "within dist.timeout_s=%g s: %s did not arrive (dead, "
        "or hung: stopped, stuck in I/O such as a hung file system, or "
        "cut off by the network). Aborting the job; if a checkpoint was "
        "written, continue with --resume auto.\n",
        host.c_str(),
        what,
        seq,
        timeout_s_,
        name_missing(comm_, missing).c_str());
    std::fflush(stderr);
  }
  MPI_Abort(comm_, kExitFailure);
  std::_Exit(kExitFailure);
}

int MpiWaiter::first_failing_rank(bool ok, const char* what) {
  int size = 1;
  MPI_Comm_size(comm_, &size);
  const int mine = ok ? size : rank();
  int lowest = mine;
  MPI_Request request;
  MT_MPI_CHECK(
      MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm_, &request),
      rank());
  wait(&request, 1, what, next_sequence());
  return lowest;
}

}  // namespace memtrain
