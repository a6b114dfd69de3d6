#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "memtrain/dist/environment.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/dist/replica_check.h"

namespace memtrain {
namespace {

TEST(MpiCommunicator, AllReduceSumsRankValuedTensorsExactly) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int64_t w = comm.size();
  auto t = torch::full({5}, static_cast<float>(comm.rank()));
  auto d = torch::arange(3, torch::kFloat64) * (comm.rank() + 1);
  auto l = torch::tensor({int64_t{1} << 40}, torch::kInt64);
  comm.all_reduce_sum(t);
  comm.all_reduce_sum(d);
  comm.all_reduce_sum(l);
  EXPECT_TRUE(torch::equal(t, torch::full({5}, w * (w - 1) / 2.0f)));
  EXPECT_TRUE(
      torch::equal(d, torch::arange(3, torch::kFloat64) * (w * (w + 1) / 2.0)));
  EXPECT_EQ(l.item<int64_t>(), w << 40);
  EXPECT_EQ(comm.stats().allreduce_calls, 3);
  EXPECT_EQ(comm.stats().allreduce_bytes, 5 * 4 + 3 * 8 + 8);
}

TEST(MpiCommunicator, BroadcastCopiesRootEverywhere) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  const int root = comm.size() - 1;
  auto t = torch::full({4, 2}, static_cast<float>(comm.rank()));
  comm.broadcast(t, root);
  EXPECT_TRUE(torch::equal(t, torch::full({4, 2}, float(root))));
  EXPECT_EQ(comm.stats().broadcast_bytes, 32);
  EXPECT_EQ(comm.stats().allreduce_calls, 0);
}

// Environment's start-up collectives, now polled against a timeout: the
// same answers as before.
TEST(Environment, AllOkAndAllGatherWithinTheCollectiveTimeout) {
  Environment env(nullptr, nullptr);  // MPI is already initialised
  EXPECT_EQ(env.collective_timeout(), 600.0);
  env.set_collective_timeout(30);
  EXPECT_EQ(env.collective_timeout(), 30.0);
  const int w = env.world_size();
  int first = -1;
  EXPECT_TRUE(env.all_ok(true, &first));
  EXPECT_EQ(first, w);
  // Ranks w-1 and (for w > 2) 1 fail: the lowest failing rank is reported.
  const bool ok = !(env.rank() == w - 1 || (w > 2 && env.rank() == 1));
  EXPECT_FALSE(env.all_ok(ok, &first));
  EXPECT_EQ(first, w > 2 ? 1 : w - 1);
  const auto all = env.all_gather("rank " + std::to_string(env.rank()));
  ASSERT_EQ(static_cast<int>(all.size()), w);
  for (int r = 0; r < w; ++r)
    EXPECT_EQ(all[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

TEST(ReplicaCheck, DetectsOneDivergentRank) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  std::vector<at::Tensor> params = {torch::ones({3, 3}), torch::zeros({2})};
  uint64_t mine = 0;
  EXPECT_TRUE(replicas_identical(comm, params, &mine));
  if (comm.size() > 1) {
    if (comm.rank() == comm.size() - 1) {
      // One bit of one element.
      params[0].view(-1)[4] = std::nextafter(1.0f, 2.0f);
    }
    EXPECT_FALSE(replicas_identical(comm, params, &mine));
  }
}

}  // namespace
}  // namespace memtrain
