#pragma once
// Communicator: how ranks exchange tensors. One interface, two backends:
// MpiCommunicator (host tensors, any build) and NcclCommunicator (CUDA
// tensors, MEMTRAIN_CUDA builds; its ncclUniqueId travels over MPI). Every
// collective is counted, so tests and metrics can see exactly how many calls
// and bytes moved. No LibTorch or MPI headers here.

#include <cstdint>
#include <string>

namespace at {
class Tensor;
}

namespace memtrain {

struct CommStats {
  int64_t allreduce_calls = 0;
  int64_t allreduce_bytes = 0;  // payload bytes handed to all-reduce
  int64_t broadcast_calls = 0;
  int64_t broadcast_bytes = 0;
};

enum class ReduceOp { kSum, kMin, kMax };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi" or "nccl", for logs.
  virtual std::string backend() const = 0;

  // Reduces `t` element-wise over all ranks with `op`, in place; every rank
  // must call it with a tensor of the same shape and dtype. `t` must be
  // contiguous. MPI: host tensors, float32/float64/int32/int64; blocks until
  // done. NCCL: CUDA tensors; enqueued on the current CUDA stream, returns
  // when enqueued.
  virtual void all_reduce(at::Tensor& t, ReduceOp op) = 0;

  void all_reduce_sum(at::Tensor& t) {
    all_reduce(t, ReduceOp::kSum);
  }

  // Copies `t` from rank `root` to every rank, in place. Same rules as
  // all_reduce_sum.
  virtual void broadcast(at::Tensor& t, int root) = 0;

  // Blocks until every rank has called it.
  virtual void barrier() = 0;

  const CommStats& stats() const {
    return stats_;
  }

 protected:
  CommStats stats_;
};

// Collective: true on every rank iff `ok` is true on every rank. For
// agreeing on a check before anyone proceeds, so no rank is left waiting in a
// collective its peers skipped. Not counted as a gradient exchange.
bool all_ranks_ok(Communicator& comm, bool ok);

}  // namespace memtrain
