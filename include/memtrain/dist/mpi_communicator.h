#pragma once
// MpiCommunicator: the Communicator over an MPI communicator, for host
// tensors. Half-precision tensors are refused: MPI has no fp16/bf16 types, so
// callers reduce in float32 (DESIGN.md).

#include <mpi.h>

#include "memtrain/dist/communicator.h"
#include "memtrain/dist/mpi_wait.h"

namespace memtrain {

class MpiCommunicator final : public Communicator {
 public:
  // Uses (does not own or free) `comm`; MPI_COMM_WORLD for the job,
  // MPI_COMM_SELF for a world of one inside one process (tests). Errors from
  // MPI are raised as memtrain::Error with MPI's message and this rank.
  // `timeout_s` > 0: a collective whose wait has lasted that many seconds
  // ends the job (see Note [Collective timeouts]); 0 waits forever. Local:
  // no communication.
  explicit MpiCommunicator(MPI_Comm comm, double timeout_s = 0.0);

  int rank() const override {
    return rank_;
  }
  int size() const override {
    return size_;
  }
  std::string backend() const override {
    return "mpi";
  }
  // MPI_Iallreduce in pieces of at most INT_MAX elements (MPI counts are
  // int), all issued at once; the work's wait() polls them all.
  std::unique_ptr<CollectiveWork> all_reduce_async(
      at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;

 private:
  MpiWaiter waiter_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace memtrain
