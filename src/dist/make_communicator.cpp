#include "memtrain/dist/make_communicator.h"

#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/dist/mpi_wait.h"
#include "memtrain/util/error.h"

#if MEMTRAIN_CUDA
#include "memtrain/dist/nccl_communicator.h"
#endif

namespace memtrain {

BackendChoice resolve_backend(const CommunicatorSpec& spec) {
  if (spec.backend == BackendChoice::kAuto) {
    return MEMTRAIN_CUDA && spec.cuda_device ? BackendChoice::kNccl
                                             : BackendChoice::kMpi;
  }
  if (spec.backend == BackendChoice::kNccl) {
    MT_CHECK(
        spec.cuda_device,
        "dist.backend=nccl reduces CUDA tensors, but this rank's device is "
        "the CPU (dist.device=cpu, or dist.device=auto found no GPU); use "
        "dist.backend=mpi (or auto), or dist.device=cuda on a machine with "
        "GPUs");
    MT_CHECK(
        MEMTRAIN_CUDA,
        "dist.backend=nccl needs a CUDA build, but this memtrain was built "
        "with MEMTRAIN_CUDA=0 (no NCCL); use dist.backend=mpi (or auto), or "
        "rebuild with launch/build.sh -DMEMTRAIN_CUDA=ON");
  }
  return spec.backend;
}

std::unique_ptr<Communicator> make_communicator(
    MPI_Comm comm, const CommunicatorSpec& spec) {
  // 1. Resolve locally; 2. agree, so that no rank starts a backend (NCCL's
  // start is collective) that a peer refused or chose differently.
  enum : int { kFailed = 0, kMpi = 1, kNccl = 2 };
  BackendChoice backend = BackendChoice::kAuto;
  std::string error;
  try {
    backend = resolve_backend(spec);
  } catch (const Error& e) {
    error = e.what();
  }
  const int mine = !error.empty()                    ? kFailed
                   : backend == BackendChoice::kNccl ? kNccl
                                                     : kMpi;
  // One MIN over (mine, -mine): the lowest and the highest choice.
  const int choice[2] = {mine, -mine};
  int extremes[2] = {mine, -mine};
  MpiWaiter waiter(comm, spec.timeout_s);
  int rank = 0;
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm, &rank);
  MPI_Request request;
  MT_MPI_CHECK(
      MPI_Iallreduce(choice, extremes, 2, MPI_INT, MPI_MIN, comm, &request),
      rank);
  waiter.wait(&request, 1, "backend agreement", waiter.next_sequence());
  const int lowest = extremes[0];
  const int highest = -extremes[1];
  if (!error.empty())
    throw Error(error);
  if (lowest == kFailed)
    throw PeerError("another rank refused its dist.backend");
  MT_CHECK(
      lowest == highest,
      "ranks chose different backends for dist.backend=",
      spec.backend,
      ": some mpi, some nccl (auto picks nccl only on ranks whose device is "
      "a GPU); give every rank a GPU, or set dist.backend=mpi");

  if (backend == BackendChoice::kMpi)
    return std::make_unique<MpiCommunicator>(comm, spec.timeout_s);
#if MEMTRAIN_CUDA
  MT_INTERNAL_ASSERT(
      spec.device_index >= 0, "a CUDA device comes with its index");
  return std::make_unique<NcclCommunicator>(
      comm, spec.device_index, spec.timeout_s);
#else
  MT_INTERNAL_ASSERT(false, "resolve_backend gave nccl on a CPU build");
  return nullptr;
#endif
}

}  // namespace memtrain
