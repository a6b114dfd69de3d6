// Unit tests run in one process; MPI is initialised so that tests can use
// MpiCommunicator over MPI_COMM_SELF (a world of one). The device of these
// tests is the CPU on every build, CUDA ones included: the accounting
// allocator is installed. Tests named *_CUDA need a GPU and are skipped
// without one.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "gpu_tests.h"
#include "memtrain/memory/device_memory.h"

int main(int argc, char** argv) {
  memtrain::memory::install_cpu_accounting();
  MPI_Init(&argc, &argv);
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  memtrain::test::filter_gpu_tests(/*report=*/true);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
