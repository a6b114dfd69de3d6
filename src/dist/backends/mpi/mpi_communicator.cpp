#include "memtrain/dist/mpi_communicator.h"

#include <torch/torch.h>

#include <climits>
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

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

// A collective in flight: its MPI requests (one per piece) and its number.
// It refers to its communicator's waiter, so it must not outlive the
// communicator.
class MpiWork final : public CollectiveWork {
 public:
  MpiWork(
      const MpiWaiter& waiter,
      std::vector<MPI_Request> requests,
      const char* what,
      int64_t sequence)
      : waiter_(waiter),
        requests_(std::move(requests)),
        what_(what),
        sequence_(sequence) {}

  ~MpiWork() override {
    if (done_ || waited_)
      return;
    try {
      wait();
    } catch (const std::exception& e) {
      // A destructor must not throw; the error is MPI's, and the next
      // collective will meet it too.
      std::fprintf(stderr, "memtrain: error: %s\n", e.what());
    }
  }

  void wait() override {
    if (done_)
      return;
    waited_ = true;  // if it throws, the destructor does not try again
    waiter_.wait(
        requests_.data(), static_cast<int>(requests_.size()), what_, sequence_);
    done_ = true;
  }

  bool test() override {
    if (!done_)
      done_ =
          waiter_.test(requests_.data(), static_cast<int>(requests_.size()));
    return done_;
  }

 private:
  const MpiWaiter& waiter_;
  std::vector<MPI_Request> requests_;
  const char* what_;
  int64_t sequence_;
  bool done_ = false;
  bool waited_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, double timeout_s)
    : waiter_(comm, timeout_s) {
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

std::unique_ptr<CollectiveWork> MpiCommunicator::all_reduce_async(
    at::Tensor& t, ReduceOp op) {
  if (t.defined() && !t.device().is_cpu())  // a GPU tensor: through the host
    return staged_all_reduce(*this, t, op, c10::Device(c10::kCPU));
  check_tensor(t);
  const MPI_Datatype type = mpi_type(t);
  char* data = static_cast<char*>(t.data_ptr());
  const int64_t elem = t.element_size();
  std::vector<MPI_Request> requests;
  for (int64_t done = 0; done < t.numel();) {
    const int64_t n = std::min<int64_t>(t.numel() - done, INT_MAX);
    requests.push_back(MPI_REQUEST_NULL);
    MT_MPI_CHECK(
        MPI_Iallreduce(
            MPI_IN_PLACE,
            data + done * elem,
            static_cast<int>(n),
            type,
            mpi_op(op),
            waiter_.comm(),
            &requests.back()),
        rank_);
    done += n;
  }
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * elem;
  return std::make_unique<MpiWork>(
      waiter_, std::move(requests), "all-reduce", waiter_.next_sequence());
}

void MpiCommunicator::broadcast(at::Tensor& t, int root) {
  if (t.defined() && !t.device().is_cpu())
    return staged_broadcast(*this, t, root, c10::Device(c10::kCPU));
  check_tensor(t);
  const int64_t bytes = t.numel() * t.element_size();
  char* data = static_cast<char*>(t.data_ptr());
  std::vector<MPI_Request> requests;
  for (int64_t done = 0; done < bytes;) {
    const int64_t n = std::min<int64_t>(bytes - done, INT_MAX);
    requests.push_back(MPI_REQUEST_NULL);
    MT_MPI_CHECK(
        MPI_Ibcast(
            data + done,
            static_cast<int>(n),
            MPI_BYTE,
            root,
            waiter_.comm(),
            &requests.back()),
        rank_);
    done += n;
  }
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += bytes;
  MpiWork(waiter_, std::move(requests), "broadcast", waiter_.next_sequence())
      .wait();
}

void MpiCommunicator::barrier() {
  std::vector<MPI_Request> requests(1, MPI_REQUEST_NULL);
  MT_MPI_CHECK(MPI_Ibarrier(waiter_.comm(), &requests[0]), rank_);
  MpiWork(waiter_, std::move(requests), "barrier", waiter_.next_sequence())
      .wait();
}

}  // namespace memtrain
