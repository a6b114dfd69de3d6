#pragma once
// make_communicator: the one place that picks and builds a Communicator
// from the config (dist.backend) and this rank's device. No LibTorch here.

#include <mpi.h>

#include <memory>
#include <string>

#include "memtrain/config/choices.h"
#include "memtrain/dist/communicator.h"

namespace memtrain {

struct CommunicatorSpec {
  BackendChoice backend = BackendChoice::kAuto;  // dist.backend
  bool cuda_device = false;  // this rank's device is a CUDA GPU
  int device_index = -1;     // its index (CUDA devices only)
  double timeout_s = 0;      // dist.timeout_s (0: wait forever)
};

// kMpi or kNccl. auto: nccl for a CUDA device on a CUDA build
// (MEMTRAIN_CUDA=1), mpi otherwise. Local. Throws memtrain::Error (a usage
// error) naming what is wrong and how to fix it: nccl with a CPU device,
// nccl on a build without CUDA.
BackendChoice resolve_backend(const CommunicatorSpec& spec);

// Collective over `comm`, blocking (within spec.timeout_s): every rank
// calls it. Resolves the backend on every rank, then agrees on it before
// any backend starts, so a rank whose spec is refused cannot leave its
// peers inside a backend's start-up: that rank throws its Error, every
// other rank a PeerError, and ranks that resolved different backends all
// throw an Error. Then builds MpiCommunicator(comm, timeout_s) or
// NcclCommunicator(comm, device_index, timeout_s) (CUDA builds), which
// throws memtrain::Error on every rank when NCCL cannot start (two ranks on
// one GPU, say). MpiCommunicator takes host tensors whatever this rank's
// device: with a CUDA device and mpi, callers stage through host memory.
// `comm` must outlive the communicator.
std::unique_ptr<Communicator> make_communicator(
    MPI_Comm comm, const CommunicatorSpec& spec);

}  // namespace memtrain
