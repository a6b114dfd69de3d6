#include "memtrain/dist/mpi_communicator.h"

#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

#define MT_MPI_CHECK(call, rank)                                           \
  do {                                                                     \
    const int mt_rc = (call);                                              \
    if (mt_rc != MPI_SUCCESS) {                                            \
      char mt_msg[MPI_MAX_ERROR_STRING];                                   \
      int mt_len = 0;                                                      \
      MPI_Error_string(mt_rc, mt_msg, &mt_len);                            \
      ::memtrain::throw_library_error(                                     \
          (rank), #call, __FILE__, __LINE__, std::string(mt_msg, mt_len)); \
    }                                                                      \
  } while (0)

MPI_Datatype mpi_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return MPI_FLOAT;
    case at::kDouble:
      return MPI_DOUBLE;
    case at::kLong:
      return MPI_INT64_T;
    case at::kInt:
      return MPI_INT32_T;
    default:
      throw InternalError(
          std::string("MpiCommunicator: unsupported dtype ") +
          std::string(c10::toString(t.scalar_type())) +
          " (MPI has no half types: reduce in float32)");
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  return MPI_SUM;
}

void check_tensor(const at::Tensor& t) {
  MT_INTERNAL_ASSERT(
      t.defined() && t.is_contiguous() && t.device().is_cpu(),
      "MpiCommunicator needs a contiguous host tensor");
}

}  // namespace

// Note [Collective timeouts]
// MPI has no timeout on a collective: a rank that died or hangs leaves its
// peers waiting forever (if mpirun does not notice first, as it does for a
// killed process). So every collective here is the non-blocking form, polled
// until it completes or dist.timeout_s passes. On timeout each waiting rank
// sends rank 0 the number of the collective it is stuck in; rank 0 collects
// these reports for a few seconds, names the ranks that never reported (dead
// or hung), and every rank calls MPI_Abort. The last complete checkpoint is
// untouched: checkpoints are written whole or not at all.

namespace {
constexpr int kArrivalTag = 7401;
constexpr double kReportSeconds = 3.0;
}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s)
    : comm_(comm), timeout_s_(timeout_s) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

void MpiCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t);
  const MPI_Datatype type = mpi_type(t);
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t elem = t.element_size();
  // MPI counts are int: reduce in pieces of at most INT_MAX elements.
  for (int64_t done = 0; done < t.numel();) {
    MPI_Request request;
    const int64_t n = std::min<int64_t>(t.numel() - done, INT_MAX);
    MT_MPI_CHECK(
        MPI_Iallreduce(
            MPI_IN_PLACE,
            data + done * elem,
            static_cast<int>(n),
            type,
            mpi_op(op),
            comm_,
            &request),
        rank_);
    wait(&request, "all-reduce");
    done += n;
  }
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * elem;
}

void MpiCommunicator::broadcast(at::Tensor& t, int root) {
  check_tensor(t);
  const int64_t bytes = t.numel() * t.element_size();
  char* data = static_cast<char*>(t.data_ptr());
  for (int64_t done = 0; done < bytes;) {
    MPI_Request request;
    const int64_t n = std::min<int64_t>(bytes - done, INT_MAX);
    MT_MPI_CHECK(
        MPI_Ibcast(
            data + done, static_cast<int>(n), MPI_BYTE, root, comm_, &request),
        rank_);
    wait(&request, "broadcast");
    done += n;
  }
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += bytes;
}

void MpiCommunicator::barrier() {
  MPI_Request request;
  MT_MPI_CHECK(MPI_Ibarrier(comm_, &request), rank_);
  wait(&request, "barrier");
}

void MpiCommunicator::wait(MPI_Request* request, const char* what) {
  ++sequence_;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  int done = 0;
  for (int spins = 0;; ++spins) {
    MT_MPI_CHECK(MPI_Test(request, &done, MPI_STATUS_IGNORE), rank_);
    if (done)
      return;
    // Spin briefly (collectives of a window take microseconds to
    // milliseconds), then poll gently.
    if (spins > 1000)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (timeout_s_ > 0 && spins % 256 == 0 &&
        std::chrono::duration<double>(Clock::now() - start).count() >
            timeout_s_) {
      timed_out(what);
    }
  }
}

void MpiCommunicator::timed_out(const char* what) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  const long long seq = static_cast<long long>(sequence_);
  if (rank_ != 0) {
    // Tell rank 0 where this rank is stuck; give it time to name the
    // missing ranks before the job ends.
    MPI_Request r;
    MPI_Isend(&seq, 1, MPI_LONG_LONG, 0, kArrivalTag, comm_, &r);
    std::fprintf(
        stderr,
        "memtrain: [rank %d, %s] error: %s #%lld did not complete "
        "within dist.timeout_s=%g s; rank 0 names the rank(s) that "
        "did not arrive (if rank 0 itself is gone, it is the one)\n",
        rank_,
        host,
        what,
        seq,
        timeout_s_);
    std::fflush(stderr);
    std::this_thread::sleep_for(
        std::chrono::duration<double>(2 * kReportSeconds));
  } else {
    std::vector<bool> reported(static_cast<size_t>(size_), false);
    reported[0] = true;
    const auto start = std::chrono::steady_clock::now();
    while (
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count() < kReportSeconds) {
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
    std::string missing;
    for (int r = 0; r < size_; ++r) {
      if (!reported[static_cast<size_t>(r)])
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    std::fprintf(
        stderr,
        "memtrain: [rank 0, %s] error: %s #%lld did not complete "
        "within dist.timeout_s=%g s: rank(s) %s did not arrive (dead "
        "or hung). Aborting the job; resume from the last "
        "checkpoint with --resume auto.\n",
        host,
        what,
        seq,
        timeout_s_,
        missing.empty() ? "(none identified)" : missing.c_str());
    std::fflush(stderr);
  }
  MPI_Abort(comm_, kExitFailure);
  std::_Exit(kExitFailure);
}

}  // namespace memtrain
