#include <gtest/gtest.h>

#include "memtrain/dist/cpu_threads.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

ThreadInputs inputs(int mask, int sharing) {
  ThreadInputs in;
  in.mask_cpus = mask;
  in.ranks_sharing_mask = sharing;
  return in;
}

TEST(ThreadPlan, BoundRanksUseTheirOwnMask) {
  // mpirun -np 2 on 2 cores: each rank bound to one core.
  EXPECT_EQ(plan_threads(inputs(1, 1)).threads, 1);
  // srun --cpus-per-task=8: a mask of 8 CPUs of its own.
  EXPECT_EQ(plan_threads(inputs(8, 1)).threads, 8);
}

TEST(ThreadPlan, UnboundRanksDivideTheMask) {
  EXPECT_EQ(plan_threads(inputs(16, 4)).threads, 4);
  EXPECT_EQ(plan_threads(inputs(2, 4)).threads, 1);  // oversubscribed: 1
  EXPECT_EQ(
      plan_threads(inputs(2, 4)).reason,
      "2 CPU(s) in the affinity mask shared by 4 local ranks");
}

TEST(ThreadPlan, SlurmCpusPerTaskCapsTheShare) {
  ThreadInputs in = inputs(64, 2);
  in.slurm_cpus_per_task = 8;
  EXPECT_EQ(plan_threads(in).threads, 8);
  in.slurm_cpus_per_task = 64;  // larger than the share: no effect
  EXPECT_EQ(plan_threads(in).threads, 32);
}

TEST(ThreadPlan, OmpNumThreadsOnlyLowersTheCount) {
  ThreadInputs in = inputs(16, 2);
  in.omp_num_threads = 2;
  EXPECT_EQ(plan_threads(in).threads, 2);
  in.omp_num_threads = 64;  // would oversubscribe the rank's 8 CPUs
  const ThreadPlan p = plan_threads(in);
  EXPECT_EQ(p.threads, 8);
  EXPECT_NE(p.reason.find("OMP_NUM_THREADS=64 capped"), std::string::npos);
}

TEST(CpuList, FormatsRangesAndParsesThemBack) {
  const std::vector<int> cpus = {0, 1, 2, 3, 8, 10, 11};
  EXPECT_EQ(format_cpu_list(cpus), "0-3,8,10-11");
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11"), cpus);
  EXPECT_EQ(format_cpu_list({5, 4, 4}), "4-5");
  EXPECT_TRUE(parse_cpu_list("").empty());
  EXPECT_THROW(parse_cpu_list("3-1"), Error);
  EXPECT_THROW(parse_cpu_list("a"), Error);
}

TEST(CpuList, RanksSharingCountsOverlapsOnThisHostOnly) {
  const std::vector<std::string> peers = {
      "n1|0-1", "n1|2-3", "n1|0-3", "n2|0-1", "n1|4,5"};
  EXPECT_EQ(ranks_sharing("n1", {0, 1}, peers), 2);  // itself and 0-3
  EXPECT_EQ(ranks_sharing("n1", {0, 1, 2, 3}, peers), 3);
  EXPECT_EQ(ranks_sharing("n2", {0, 1}, peers), 1);
  EXPECT_EQ(ranks_sharing("n1", {4}, peers), 1);
}

TEST(CpuList, ThisProcessHasAMask) {
  EXPECT_FALSE(affinity_cpus().empty());
}

TEST(Blas, TheLoadedLibraryProvidesSgemm) {
  // LibTorch's CPU build links a BLAS: sgemm_ resolves to a real file.
  const BlasInfo b = loaded_blas();
  EXPECT_FALSE(b.library.empty());
}

}  // namespace
}  // namespace memtrain
