#include "memtrain/dist/mpi_communicator.h"

#include <torch/torch.h>

#include <climits>
#include <string>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

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

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s)
    : waiter_(comm, timeout_s) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

void MpiCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  check_tensor(t);
  const MPI_Datatype type = mpi_type(t);
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t elem = t.element_size();
  const int64_t seq = waiter_.next_sequence();
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
            waiter_.comm(),
            &request),
        rank_);
    waiter_.wait(&request, 1, "all-reduce", seq);
    done += n;
  }
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * elem;
}

void MpiCommunicator::broadcast(at::Tensor& t, int root) {
  check_tensor(t);
  const int64_t bytes = t.numel() * t.element_size();
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t seq = waiter_.next_sequence();
  for (int64_t done = 0; done < bytes;) {
    MPI_Request request;
    const int64_t n = std::min<int64_t>(bytes - done, INT_MAX);
    MT_MPI_CHECK(
        MPI_Ibcast(
            data + done,
            static_cast<int>(n),
            MPI_BYTE,
            root,
            waiter_.comm(),
            &request),
        rank_);
    waiter_.wait(&request, 1, "broadcast", seq);
    done += n;
  }
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += bytes;
}

void MpiCommunicator::barrier() {
  MPI_Request request;
  MT_MPI_CHECK(MPI_Ibarrier(waiter_.comm(), &request), rank_);
  waiter_.wait(&request, 1, "barrier", waiter_.next_sequence());
}

}  // namespace memtrain
