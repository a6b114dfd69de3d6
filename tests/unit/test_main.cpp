// Unit tests run in one process; MPI is initialised so that tests can use
// MpiCommunicator over MPI_COMM_SELF (a world of one).

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "memtrain/memory/device_memory.h"

int main(int argc, char** argv) {
  memtrain::memory::install_cpu_accounting();
  MPI_Init(&argc, &argv);
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  MPI_Finalize();
  return rc;
}
