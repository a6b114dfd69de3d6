#pragma once
// NcclCommunicator: the Communicator over NCCL for CUDA tensors
// (MEMTRAIN_CUDA builds only). Collectives run on the communicator's own
// CUDA stream, ordered after the caller's current stream with an event, and
// complete through CollectiveWork::wait() (see communicator.h); NCCL's
// asynchronous errors and dist.timeout_s end the job instead of hanging it
// (Note [Collective timeouts]). No nccl.h or CUDA header here.
//
// Threads: one thread at a time per communicator; autograd's device thread
// may issue and the main thread wait. MPI (thread level FUNNELED) is called
// only from the thread that built the communicator: by the start and
// barrier(), and to end the job after an NCCL error or a timeout. On any
// other thread (autograd's, issuing an overlapped bucket or testing one) an
// error or timeout aborts the NCCL communicator and throws
// CollectiveFailure, which the main thread passes to end_job_after().
//
// Compiled against the torch wheels' LibTorch and NCCL, not run on a GPU
// yet (tests/gpu/README.md).

#include <mpi.h>

#include <memory>

#include "memtrain/dist/communicator.h"

namespace memtrain {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm` (every rank calls it), blocking within
  // `timeout_s` (0: wait forever). Binds this rank to CUDA device `device`,
  // gathers every rank's GPU over MPI and refuses two ranks on one GPU (a
  // memtrain::Error on every rank), makes the ncclUniqueId on rank 0 and
  // broadcasts it over MPI, then starts a non-blocking NCCL communicator and
  // polls it. An NCCL error during the start ends the job with NCCL's
  // message, this rank and host; a start that has not finished after
  // `timeout_s` ends it naming the ranks that did not arrive.
  NcclCommunicator(MPI_Comm comm, int device, double timeout_s = 0.0);
  // Finalizes the NCCL communicator together with the peers (within the
  // timeout; aborted after it) and frees it.
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  BackendChoice backend() const override {
    return BackendChoice::kNccl;
  }
  // CUDA tensors on `device`; float32/float64/float16/bfloat16/int32/int64.
  // The returned work refers to this communicator: it must not outlive it.
  std::unique_ptr<CollectiveWork> all_reduce_async(
      at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  // Waits (host) for this rank's current stream, then an MPI barrier; both
  // within the timeout.
  void barrier() override;
  // The timeout protocol (naming the ranks that did not arrive) or, for an
  // NCCL error, the message and MPI_Abort; never returns.
  void end_job_after(const CollectiveFailure& failure) override;
  void wait_for_device(const std::function<bool()>& done) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrain
