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

}  // namespace
}  // namespace memtrain
