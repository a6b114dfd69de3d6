// Tests that need a GPU. Their names end in _CUDA: the mains skip them where
// no GPU is usable (tests/support/gpu_tests.h).

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "memtrain/dist/mpi_communicator.h"
#if MEMTRAIN_CUDA
#include "memtrain/dist/nccl_communicator.h"
#endif

namespace memtrain {
namespace {

// MPI reduces host memory: a CUDA tensor goes through a host copy
// (staged_all_reduce) and comes back on its device, counted once.
TEST(MpiCommunicatorGpu, StagesCudaTensorThroughTheHost_CUDA) {
  MpiCommunicator comm(MPI_COMM_SELF);
  const at::Tensor expected = torch::arange(4, torch::kFloat);
  at::Tensor t = expected.to(torch::kCUDA);
  comm.all_reduce_sum(t);
  comm.broadcast(t, 0);
  EXPECT_TRUE(t.is_cuda());
  EXPECT_TRUE(torch::equal(t.cpu(), expected));
  EXPECT_EQ(comm.stats().allreduce_calls, 1);
  EXPECT_EQ(comm.stats().allreduce_bytes, 4 * 4);
}

#if MEMTRAIN_CUDA
// A world of one over NCCL: all-reduce and broadcast leave the tensor as it
// was, on the current stream, and are counted.
TEST(NcclCommunicatorGpu, WorldOfOne_CUDA) {
  NcclCommunicator comm(MPI_COMM_SELF, /*device=*/0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend(), "nccl");
  const at::Tensor expected = torch::arange(8, torch::kFloat);
  at::Tensor t = expected.to(torch::Device(torch::kCUDA, 0));
  comm.all_reduce_sum(t);
  comm.broadcast(t, 0);
  comm.barrier();
  EXPECT_TRUE(torch::equal(t.cpu(), expected));
  EXPECT_EQ(comm.stats().allreduce_calls, 1);
  EXPECT_EQ(comm.stats().allreduce_bytes, 8 * 4);
  EXPECT_EQ(comm.stats().broadcast_calls, 1);
}
#endif

}  // namespace
}  // namespace memtrain
