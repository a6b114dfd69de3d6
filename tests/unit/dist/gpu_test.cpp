// Tests that need a GPU. Their names end in _CUDA: the mains skip them where
// no GPU is usable (tests/support/gpu_tests.h).

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "memtrain/device/placement.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"
#include "test_support.h"
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

// Note [CUDA start-up order]: choosing the CUDA placement initialises CUDA,
// so set_up_run's first memory calls (release the cache, reset the peak,
// cap) work before the process's first CUDA tensor; before the fix they
// threw "did you call init?" and the cap asserted. In a process of its own:
// any CUDA tensor an earlier test made would have initialised CUDA already.
TEST(CudaStartup, MemoryCallsBeforeTheFirstTensor_CUDA) {
  if (std::getenv("MEMTRAIN_TEST_OWN_PROCESS") == nullptr) {
    EXPECT_EQ(
        test::run_in_own_process(
            "CudaStartup.MemoryCallsBeforeTheFirstTensor_CUDA"),
        0);
    return;
  }
  const auto placement = Placement::choose(
      DeviceChoice::kCuda, /*local_rank=*/0, "expandable_segments:True");
  ASSERT_TRUE(placement->is_cuda());
  EXPECT_EQ(memory::backend_name(), "cuda-caching");
  memory::release_cache();
  memory::reset_peak();
  const int64_t budget = int64_t{4} << 30;
  // The context and the libraries loaded for the measurement take memory
  // outside the allocator: on the order of 100 MiB to 1 GiB.
  const int64_t outside = memory::measure_outside();
  EXPECT_GT(outside, int64_t{10} << 20);
  EXPECT_LT(outside, budget / 2);
  memory::set_cap(budget - outside);
  EXPECT_EQ(memory::stats().cap, budget - outside);
  EXPECT_EQ(
      memory::cuda_allocator_settings().text(), "expandable_segments:True");
  const at::Tensor t = torch::empty(
      {int64_t{1} << 20},
      torch::dtype(torch::kFloat).device(placement->device()));
  EXPECT_GE(memory::stats().allocated, int64_t{4} << 20);
  EXPECT_GE(memory::device_used_bytes(), outside + (int64_t{4} << 20));
  EXPECT_NO_THROW(
      memory::check_device_within(budget, outside, "memory.budget=4GiB"));
  // A budget the device is already past is named at the boundary.
  EXPECT_THROW(
      memory::check_device_within(outside / 2, outside, "memory.budget=x"),
      Error);
}

#if MEMTRAIN_CUDA
// A world of one over NCCL: all-reduce and broadcast leave the tensor as it
// was, on the current stream, and are counted.
TEST(NcclCommunicatorGpu, WorldOfOne_CUDA) {
  NcclCommunicator comm(MPI_COMM_SELF, /*device=*/0);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.backend(), BackendChoice::kNccl);
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
