#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "memtrain/dist/environment.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_digest.h"

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

// A local rank at or beyond the node's count the launcher gave: refused
// naming both variables (on a GPU node two ranks would take one device);
// without a count, the rank's own is taken.
TEST(LocalRank, ARankBeyondItsNodesCountIsRefused) {
  const std::vector<std::pair<std::map<std::string, std::string>, std::string>>
      bad = {
          {{{"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
            {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
           "OMPI_COMM_WORLD_LOCAL_RANK=2 is not a node-local rank below "
           "OMPI_COMM_WORLD_LOCAL_SIZE=2"},
          {{{"SLURM_LOCALID", "3"},
            {"SLURM_NODEID", "1"},
            {"SLURM_TASKS_PER_NODE", "4,3"}},
           "SLURM_LOCALID=3 is not a node-local rank below "
           "SLURM_TASKS_PER_NODE=4,3 (3 on node 1)"},
          {{{"SLURM_LOCALID", "8"}, {"SLURM_NTASKS_PER_NODE", "8"}},
           "SLURM_LOCALID=8 is not a node-local rank below "
           "SLURM_NTASKS_PER_NODE=8"},
          {{{"LOCAL_RANK", "9"}, {"LOCAL_WORLD_SIZE", "4"}},
           "LOCAL_RANK=9 is not a node-local rank below LOCAL_WORLD_SIZE=4"},
      };
  for (const auto& [vars, want] : bad) {
    try {
      from(vars);
      ADD_FAILURE() << want << ": taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
          << e.what();
    }
  }
  const LocalRank r = from({{"LOCAL_RANK", "3"}});
  EXPECT_EQ(r.local_size, 4);
}

TEST(LocalRank, SlurmTasksPerNodeIsReadForThisNode) {
  // Two nodes of two tasks: 2(x2); node 1 of "3,1" has one task.
  LocalRank r = from(
      {{"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "1"},
       {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  EXPECT_EQ(r.local_rank, 1);
  EXPECT_EQ(r.local_size, 2);
  r = from(
      {{"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "1"},
       {"SLURM_TASKS_PER_NODE", "3,1"}});
  EXPECT_EQ(r.local_size, 1);
  r = from(
      {{"SLURM_LOCALID", "2"},
       {"SLURM_NODEID", "0"},
       {"SLURM_TASKS_PER_NODE", "3,1"}});
  EXPECT_EQ(r.local_size, 3);
  // --ntasks-per-node=3 with 4 tasks: the layout by node wins over the
  // most per node, and the step's layout over the job's.
  r = from(
      {{"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "1"},
       {"SLURM_NTASKS_PER_NODE", "3"},
       {"SLURM_TASKS_PER_NODE", "3,1"}});
  EXPECT_EQ(r.local_size, 1);
  r = from(
      {{"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "1"},
       {"SLURM_STEP_TASKS_PER_NODE", "2(x2)"},
       {"SLURM_TASKS_PER_NODE", "3,1"}});
  EXPECT_EQ(r.local_size, 2);
}

TEST(SlurmTasksPerNode, EachNodesCountInNodeOrder) {
  const std::vector<int> want = {4, 4, 3, 1, 1, 1, 2};
  for (int node = 0; node < static_cast<int>(want.size()); ++node)
    EXPECT_EQ(slurm_tasks_on_node("4(x2),3,1(x3),2", node), want[node]) << node;
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 0), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x2)", 1), 2);
  EXPECT_EQ(slurm_tasks_on_node("3,1", 0), 3);
  EXPECT_EQ(slurm_tasks_on_node("3,1", 1), 1);
  EXPECT_EQ(slurm_tasks_on_node("16", 0), 16);
}

TEST(SlurmTasksPerNode, MalformedOrShortIsRefusedNamingTheValue) {
  for (const char* bad :
       {"",
        "x",
        "2(x2",
        "2(x)",
        "2(2)",
        "3,,1",
        "-1",
        "0",
        "2(x0)",
        " 2",
        "2(x2)y"}) {
    try {
      slurm_tasks_on_node(bad, 0);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(
              std::string("SLURM_TASKS_PER_NODE='") + bad + "'"),
          std::string::npos)
          << e.what();
    }
  }
  try {
    slurm_tasks_on_node("2(x2)", 2);
    ADD_FAILURE() << "node 2 of 2(x2) accepted";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("lists 2 node(s), and this is node 2"),
        std::string::npos)
        << e.what();
  }
}

TEST(NodeLayout, NodesInOrderOfTheirLowestRank) {
  const NodeLayout even = node_layout({"a", "a", "b", "b"});
  EXPECT_EQ(even.node_count(), 2);
  EXPECT_EQ(even.node_of_rank, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(even.describe(), "2 nodes × 2 ranks");
  EXPECT_EQ(even.name_ranks({2, 3}), "ranks 2, 3 on b");
  EXPECT_EQ(even.name_ranks({1, 3}), "rank 1 on a; rank 3 on b");

  const NodeLayout uneven = node_layout({"n2", "n1", "n2", "n2"});
  EXPECT_EQ(uneven.node_of_rank, (std::vector<int>{0, 1, 0, 0}));
  EXPECT_EQ(uneven.ranks_per_node, (std::vector<int>{3, 1}));
  EXPECT_EQ(uneven.describe(), "2 nodes: 3+1 ranks");

  // Ranks without a known host (before the hosts were gathered): named
  // alone.
  EXPECT_EQ(node_layout({}).name_ranks({2, 3}), "ranks 2, 3");
  EXPECT_EQ(even.name_ranks({3, 7}), "rank 3 on b; rank 7");

  EXPECT_EQ(node_layout({"h"}).describe(), "1 node × 1 rank");
  EXPECT_EQ(node_layout({"h", "h"}).describe(), "1 node × 2 ranks");
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

// file_digest: the copies that ranks on different nodes open are compared
// by size and 64 sampled 64 KiB blocks (the first and the last among
// them): equal copies agree, a byte changed in a sampled block or a
// different size disagrees, a missing file is an error naming it.
TEST(FileDigest, EqualCopiesAgreeAndChangedOnesDoNot) {
  const std::string dir = "/tmp/mt-digest-" + std::to_string(::getpid());
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  const size_t size = 10 * 1024 * 1024 + 123;  // 161 blocks, 64 sampled
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i)
    bytes[i] = static_cast<char>((i * 2654435761u) >> 13);
  auto write = [&](const std::string& name, const std::string& b) {
    std::ofstream(dir + "/" + name, std::ios::binary) << b;
    return dir + "/" + name;
  };
  const std::string a = write("a", bytes);
  const std::string copy = write("copy", bytes);
  EXPECT_EQ(file_digest(a), file_digest(copy));
  EXPECT_EQ(file_digest(a).rfind("10485883 bytes, digest ", 0), 0u)
      << file_digest(a);
  std::string last = bytes;
  last[size - 1] ^= 1;  // the last block is always read
  EXPECT_NE(file_digest(a), file_digest(write("last", last)));
  // Block 1 lies between the sampled blocks 0 and 2 (161 blocks, 64
  // taken): the sample misses a change there, the whole file does not.
  std::string between = bytes;
  between[64 * 1024 + 5] ^= 1;
  const std::string b = write("between", between);
  EXPECT_EQ(file_digest(a), file_digest(b));
  EXPECT_NE(file_digest(a, /*whole=*/true), file_digest(b, /*whole=*/true));
  std::string first = bytes;
  first[100] ^= 1;
  EXPECT_NE(file_digest(a), file_digest(write("first", first)));
  EXPECT_NE(file_digest(a), file_digest(write("shorter", bytes.substr(1))));
  const std::string small = write("small", "abc");  // under one block
  EXPECT_EQ(file_digest(small), file_digest(write("small2", "abc")));
  EXPECT_NE(file_digest(small), file_digest(write("small3", "abd")));
  try {
    file_digest(dir + "/missing");
    FAIL() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "cannot read '" + dir + "/missing': no such file"),
        std::string::npos)
        << e.what();
  }
  // A FIFO is refused without being opened (an open would block).
  ASSERT_EQ(std::system(("mkfifo " + dir + "/pipe").c_str()), 0);
  try {
    file_digest(dir + "/pipe");
    FAIL() << "no error for a FIFO";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a FIFO"), std::string::npos)
        << e.what();
  }
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace memtrain
