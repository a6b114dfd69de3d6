// Unit tests run in one process; MPI is initialised so that tests can use
// MpiCommunicator over MPI_COMM_SELF (a world of one). The device of these
// tests is the CPU on every build, CUDA ones included: the accounting
// allocator is installed. Tests named *_CUDA need a GPU and are skipped
// without one.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdlib>

#include "gpu_tests.h"
#include "memtrain/memory/device_memory.h"

int main(int argc, char** argv) {
  // A test that needs a process of its own re-runs this binary with
  // MEMTRAIN_TEST_OWN_PROCESS set (gpu_test.cpp): no CPU allocator, no MPI,
  // so that it chooses its device as memtrain does.
  const bool own = std::getenv("MEMTRAIN_TEST_OWN_PROCESS") != nullptr;
  if (!own) {
    memtrain::memory::install_cpu_accounting();
    MPI_Init(&argc, &argv);
  }
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  memtrain::test::filter_gpu_tests(/*report=*/!own);
  const int rc = RUN_ALL_TESTS();
  if (!own)
    MPI_Finalize();
  return rc;
}
