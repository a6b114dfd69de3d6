// Built only with MEMTRAIN_CUDA=ON.
#include "memtrain/dist/nccl_communicator.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

#define MT_NCCL_CHECK(call, rank)                                       \
  do {                                                                  \
    const ncclResult_t mt_rc = (call);                                  \
    if (mt_rc != ncclSuccess) {                                         \
      ::memtrain::throw_library_error(                                  \
          (rank),                                                       \
          #call,                                                        \
          __FILE__,                                                     \
          __LINE__,                                                     \
          std::string(ncclGetErrorString(mt_rc)) +                      \
              " (set NCCL_DEBUG=INFO for NCCL's reasons; two ranks on " \
              "one GPU are refused)");                                  \
    }                                                                   \
  } while (0)

#define MT_CUDA_CHECK(call, rank)                                        \
  do {                                                                   \
    const cudaError_t mt_rc = (call);                                    \
    if (mt_rc != cudaSuccess) {                                          \
      ::memtrain::throw_library_error(                                   \
          (rank), #call, __FILE__, __LINE__, cudaGetErrorString(mt_rc)); \
    }                                                                    \
  } while (0)

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    default:
      throw InternalError(
          std::string("NcclCommunicator: unsupported dtype ") +
          c10::toString(t.scalar_type()));
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

}  // namespace

struct NcclCommunicator::Impl {
  MPI_Comm mpi;
  ncclComm_t comm = nullptr;
  int rank = 0;
  int size = 1;
  int device = 0;

  cudaStream_t stream_for(const at::Tensor& t) const {
    MT_INTERNAL_ASSERT(
        t.defined() && t.is_cuda() && t.is_contiguous() &&
            t.device().index() == device,
        "NcclCommunicator needs a contiguous tensor on cuda:",
        device);
    return c10::cuda::getCurrentCUDAStream(device).stream();
  }
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, int device)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.mpi = comm;
  m.device = device;
  MPI_Comm_rank(comm, &m.rank);
  MPI_Comm_size(comm, &m.size);
  MT_CUDA_CHECK(cudaSetDevice(device), m.rank);
  ncclUniqueId id;
  if (m.rank == 0)
    MT_NCCL_CHECK(ncclGetUniqueId(&id), m.rank);
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  MT_NCCL_CHECK(ncclCommInitRank(&m.comm, m.size, id, m.rank), m.rank);
}

NcclCommunicator::~NcclCommunicator() {
  if (impl_ && impl_->comm)
    ncclCommDestroy(impl_->comm);
}

int NcclCommunicator::rank() const {
  return impl_->rank;
}

int NcclCommunicator::size() const {
  return impl_->size;
}

void NcclCommunicator::all_reduce(at::Tensor& t, ReduceOp op) {
  const cudaStream_t stream = impl_->stream_for(t);
  MT_NCCL_CHECK(
      ncclAllReduce(
          t.data_ptr(),
          t.data_ptr(),
          static_cast<size_t>(t.numel()),
          nccl_type(t),
          nccl_op(op),
          impl_->comm,
          stream),
      impl_->rank);
  stats_.allreduce_calls += 1;
  stats_.allreduce_bytes += t.numel() * t.element_size();
}

void NcclCommunicator::broadcast(at::Tensor& t, int root) {
  const cudaStream_t stream = impl_->stream_for(t);
  MT_NCCL_CHECK(
      ncclBroadcast(
          t.data_ptr(),
          t.data_ptr(),
          static_cast<size_t>(t.numel()),
          nccl_type(t),
          root,
          impl_->comm,
          stream),
      impl_->rank);
  stats_.broadcast_calls += 1;
  stats_.broadcast_bytes += t.numel() * t.element_size();
}

void NcclCommunicator::barrier() {
  MT_CUDA_CHECK(
      cudaStreamSynchronize(
          c10::cuda::getCurrentCUDAStream(impl_->device).stream()),
      impl_->rank);
  MPI_Barrier(impl_->mpi);
}

}  // namespace memtrain
