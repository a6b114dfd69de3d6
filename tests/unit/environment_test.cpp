#include <gtest/gtest.h>

#include <map>

#include "memtrain/dist/environment.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

LocalRank from(const std::map<std::string, std::string>& vars) {
  return local_rank_from_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LocalRank, OpenMpiSlurmTorchrunInThatOrder) {
  LocalRank r = from(
      {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
       {"SLURM_LOCALID", "1"}});
  EXPECT_EQ(r.local_rank, 3);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.source, "openmpi");

  r = from({{"SLURM_LOCALID", "2"}, {"SLURM_TASKS_PER_NODE", "4(x2),3"}});
  EXPECT_EQ(r.local_rank, 2);
  EXPECT_EQ(r.local_size, 4);
  EXPECT_EQ(r.source, "slurm");

  r = from({{"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "8"}});
  EXPECT_EQ(r.local_size, 8);

  r = from({{"LOCAL_RANK", "5"}, {"LOCAL_WORLD_SIZE", "8"}});
  EXPECT_EQ(r.local_rank, 5);
  EXPECT_EQ(r.local_size, 8);
  EXPECT_EQ(r.source, "torchrun");

  r = from({});
  EXPECT_EQ(r.source, "");
  EXPECT_EQ(r.local_rank, 0);
}

TEST(LocalRank, MalformedValueIsAnError) {
  EXPECT_THROW(from({{"LOCAL_RANK", "x"}}), Error);
  EXPECT_THROW(from({{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}), Error);
}

void launch(int world, const std::map<std::string, std::string>& vars) {
  check_launch_world(world, [&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(LaunchWorld, MoreTasksThanMpiSeesIsRefusedWithTheFix) {
  // srun without PMI: 4 tasks, each a world of 1.
  try {
    launch(1, {{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("srun --mpi=pmix"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("4 tasks"), std::string::npos);
  }
  // Started by hand in a 4-task batch script: one world of 1.
  try {
    launch(1, {{"SLURM_NTASKS", "4"}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("srun --mpi=pmix"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("4 tasks"), std::string::npos);
  }
  // The step's count wins over the job's.
  EXPECT_THROW(
      launch(
          2,
          {{"SLURM_PROCID", "0"},
           {"SLURM_NTASKS", "2"},
           {"SLURM_STEP_NUM_TASKS", "8"}}),
      Error);
  EXPECT_NO_THROW(launch(
      8,
      {{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "16"},
       {"SLURM_STEP_NUM_TASKS", "8"}}));
  // torchrun's copies.
  try {
    launch(1, {{"WORLD_SIZE", "4"}, {"TORCHELASTIC_RUN_ID", "x"}});
    FAIL() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mpirun -np 4"), std::string::npos)
        << e.what();
  }
  // A foreign mpirun.
  EXPECT_THROW(launch(1, {{"OMPI_COMM_WORLD_SIZE", "2"}}), Error);
}

TEST(LaunchWorld, MatchingOrSmallerLaunchesAreAccepted) {
  EXPECT_NO_THROW(launch(1, {}));
  EXPECT_NO_THROW(launch(4, {{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}}));
  // mpirun -np 2 inside a 4-task allocation: Open MPI's count decides.
  EXPECT_NO_THROW(launch(
      2,
      {{"OMPI_COMM_WORLD_SIZE", "2"},
       {"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "4"}}));
  // One task of srun -n 1 inside a 4-task allocation.
  EXPECT_NO_THROW(
      launch(1, {{"SLURM_NTASKS", "4"}, {"SLURM_STEP_NUM_TASKS", "1"}}));
  // WORLD_SIZE alone is too generic a name to act on.
  EXPECT_NO_THROW(launch(1, {{"WORLD_SIZE", "4"}}));
  EXPECT_NO_THROW(launch(4, {{"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "4"}}));
}

}  // namespace
}  // namespace memtrain
