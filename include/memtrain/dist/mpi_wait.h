#pragma once
// MpiWaiter: waiting for non-blocking MPI collectives with a timeout, shared
// by Environment (the start-up agreement) and the communicators (training).
// See Note [Collective timeouts] in src/dist/mpi_wait.cpp. No LibTorch here.
//
// Every call must come from the thread that initialised MPI (Environment
// asks for MPI_THREAD_FUNNELED).

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memtrain/util/error.h"

// Throws memtrain::Error "[rank R, HOST] CALL failed at FILE:LINE: MPI's
// message" when an MPI call does not return MPI_SUCCESS. The communicator
// must have MPI_ERRORS_RETURN set (Environment and MpiCommunicator do),
// otherwise MPI aborts before the check sees the code.
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

namespace memtrain {

// The host of every rank of MPI_COMM_WORLD, by rank: Environment sets it
// once at start-up, and timeout messages name the hosts of the ranks that
// did not arrive. Until then they name ranks alone.
void set_rank_hosts(std::vector<std::string> hosts);

class MpiWaiter {
 public:
  // Uses (does not own) `comm`. `timeout_s` > 0: a collective that has not
  // completed that many seconds after its wait began ends the job; 0 waits
  // forever. Makes no MPI call, so it may be built before MPI_Init.
  MpiWaiter(MPI_Comm comm, double timeout_s);

  void set_timeout(double seconds);
  double timeout_s() const {
    return timeout_s_;
  }
  MPI_Comm comm() const {
    return comm_;
  }

  // Numbers a collective as it is issued: 1, 2, ... Ranks issue collectives
  // in the same order, so a number names the same collective on every rank;
  // timeout messages quote it.
  int64_t next_sequence() {
    return ++sequence_;
  }

  // Blocks until all `count` requests have completed (they become
  // MPI_REQUEST_NULL). Polls with MPI_Testall, which also drives MPI's
  // progress: briefly spinning, then sleeping 100 us between polls. When
  // the timeout is set and passes (counted from this call), ends the job
  // with timed_out(what, sequence); never throws for that. Throws
  // memtrain::Error with MPI's message when MPI reports an error.
  // `between`, when given, is called after every poll that found the
  // requests unfinished: other work in flight moves on while this waits.
  void wait(
      MPI_Request* requests,
      int count,
      const char* what,
      int64_t sequence,
      const std::function<void()>& between = nullptr) const;

  // Non-blocking: one MPI_Testall. True when all requests have completed.
  bool test(MPI_Request* requests, int count) const;

  // Ends the job after a collective did not complete in time, naming the
  // ranks that did not arrive (Note [Collective timeouts]): every rank that
  // gets here reports to rank 0, rank 0 waits a few seconds for the reports
  // and names the ranks that never reported, then MPI_Abort. `what` and
  // `sequence` name the collective in the messages.
  [[noreturn]] void timed_out(const char* what, int64_t sequence) const;

  // Collective, blocking, within the timeout: the lowest rank of the
  // communicator that passed ok=false, or its size when every rank passed
  // ok=true. The same value on every rank. `what` names it in messages.
  int first_failing_rank(bool ok, const char* what);

 private:
  int rank() const;

  MPI_Comm comm_;
  double timeout_s_;
  int64_t sequence_ = 0;
};

}  // namespace memtrain
