#pragma once
// MpiCommunicator: the Communicator over an MPI communicator, for host
// tensors. Half-precision tensors are refused: MPI has no fp16/bf16 types, so
// callers reduce in float32 (DESIGN.md).

#include <mpi.h>

#include <memory>
#include <string>

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
  BackendChoice backend() const override {
    return BackendChoice::kMpi;
  }
  // MPI_Iallreduce in pieces of at most INT_MAX elements (MPI counts are
  // int), all issued at once; the work's wait() polls them all. A float32
  // sum of at least 64 KiB when some node holds two ranks or more goes
  // through each node's shared-memory window instead, between nodes
  // through their leaders (hierarchical), and is complete on return (Note
  // [Shared-memory all-reduce]).
  std::unique_ptr<CollectiveWork> all_reduce_async(
      at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  void barrier() override;

  ~MpiCommunicator() override;

  // Whether float32 sums go through shared memory (decided, collectively,
  // at the first one; false before it).
  bool uses_shared_memory() const;
  // How float32 sums of 64 KiB or more travel, in words: the flat
  // MPI_Iallreduce, one node's shared memory, or hierarchical.
  std::string sum_path() const;
  bool all_reduce_overlaps() const override {
    return !uses_shared_memory();
  }

 private:
  struct Shm;
  class LeaderRing;
  bool shm_all_reduce(at::Tensor& t, ReduceOp op);
  bool shm_ready();
  void shm_step(int64_t sequence);

  MpiWaiter waiter_;
  int rank_ = 0;
  int size_ = 1;
  std::unique_ptr<Shm> shm_;
  bool shm_decided_ = false;
};

}  // namespace memtrain
