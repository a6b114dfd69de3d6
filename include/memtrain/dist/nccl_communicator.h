#pragma once
// NcclCommunicator: the Communicator over NCCL for CUDA tensors
// (MEMTRAIN_CUDA builds only). The ncclUniqueId is made on rank 0 and
// broadcast over MPI. Collectives are enqueued on the current CUDA stream of
// the tensor's device and return once enqueued: order later work after them
// with stream semantics, not host syncs. No nccl.h or CUDA header here.

#include <mpi.h>

#include <memory>

#include "memtrain/dist/communicator.h"

namespace memtrain {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm` (every rank calls it). Binds this rank to CUDA
  // device `device`. Throws memtrain::Error with NCCL's message, the rank
  // and the host when NCCL cannot start (two ranks on one GPU, say).
  NcclCommunicator(MPI_Comm comm, int device);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override {
    return "nccl";
  }
  // CUDA tensors; float32/float64/float16/bfloat16/int32/int64.
  void all_reduce(at::Tensor& t, ReduceOp op) override;
  void broadcast(at::Tensor& t, int root) override;
  // Waits for this rank's current stream, then an MPI barrier.
  void barrier() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrain
