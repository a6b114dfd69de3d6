// main for tests run under mpirun: every rank runs every test; rank 0 prints
// gtest's report, other ranks print only their failures (tagged with the
// rank); the exit status is the same on every rank (any failure anywhere
// fails all), so mpirun and ctest see one verdict. As in the unit tests'
// main, the device is the CPU (accounting allocator) on every build, and
// *_CUDA tests are skipped without a GPU.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include "gpu_tests.h"
#include "memtrain/memory/device_memory.h"

#include <cstdio>

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::fprintf(
          stderr,
          "[rank %d] %s:%d: failure\n%s\n",
          rank_,
          r.file_name() ? r.file_name() : "?",
          r.line_number(),
          r.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  memtrain::memory::install_cpu_accounting();
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  torch::set_num_threads(1);
  ::testing::InitGoogleTest(&argc, argv);
  memtrain::test::filter_gpu_tests(/*report=*/rank == 0);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  int rc = RUN_ALL_TESTS();
  int any = 0;
  MPI_Allreduce(&rc, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any;
}
