#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memtrain/dist/gradient_sync.h"
#include "memtrain/dist/mpi_communicator.h"

namespace memtrain {
namespace {

TEST(GradientSync, BucketsFollowSizeAndCarryExtras) {
  MpiCommunicator comm(MPI_COMM_SELF);
  std::vector<at::Tensor> params = {
      torch::zeros({10}),
      torch::zeros({30}),
      torch::zeros({5}),
      torch::zeros({100})};
  // 40 floats a bucket: [10, 30] [5] [100] (too big alone) + 2 extras.
  GradientSync sync(comm, params, 40 * 4, 2);
  EXPECT_EQ(sync.num_buckets(), 3);
  EXPECT_EQ(sync.bytes_per_sync(), (145 + 2) * 4);

  for (auto& p : params)
    p.mutable_grad() = torch::full_like(p, 2.0);
  params[2].mutable_grad() = torch::Tensor();  // no gradient: zeros
  std::vector<float> extras = {1.5f, 3.0f};
  sync.sync(extras);
  EXPECT_EQ(comm.stats().allreduce_calls, 3);
  EXPECT_EQ(comm.stats().allreduce_bytes, (145 + 2) * 4);
  EXPECT_FLOAT_EQ(extras[0], 1.5f);
  EXPECT_FLOAT_EQ(extras[1], 3.0f);
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({30}, 2.0)));
  EXPECT_TRUE(torch::equal(params[2].grad(), torch::zeros({5})));
}

TEST(GradientSync, BackwardAloneMovesNothing) {
  MpiCommunicator comm(MPI_COMM_SELF);
  auto w = torch::randn({8, 4}, torch::requires_grad());
  GradientSync sync(comm, {w}, 25 << 20, 2);
  for (int k = 0; k < 4; ++k) {
    (torch::randn({3, 8}).matmul(w)).sum().backward();
    EXPECT_EQ(comm.stats().allreduce_calls, 0);
    EXPECT_EQ(comm.stats().allreduce_bytes, 0);
  }
  std::vector<float> extras = {0.f, 0.f};
  sync.sync(extras);
  EXPECT_EQ(comm.stats().allreduce_calls, 1);
  EXPECT_EQ(comm.stats().allreduce_bytes, (32 + 2) * 4);
}

}  // namespace
}  // namespace memtrain

namespace memtrain {
namespace {

// Note [Overlapping the boundary all-reduce]: an armed backward starts
// every bucket but the last as soon as its gradients are final; an unarmed
// one starts none; the sums are the same either way.
TEST(GradientSync, ArmedBackwardLaunchesBucketsEarly) {
  torch::manual_seed(3);
  torch::nn::Sequential net(
      torch::nn::Linear(8, 16),
      torch::nn::Functional(torch::relu),
      torch::nn::Linear(16, 16),
      torch::nn::Functional(torch::relu),
      torch::nn::Linear(16, 4));
  const auto x = torch::randn({5, 8});
  std::vector<at::Tensor> expected;
  {
    net->zero_grad();
    net->forward(x).pow(2).sum().backward();
    for (const auto& p : net->parameters())
      expected.push_back(p.grad().clone());
  }
  for (bool armed : {false, true}) {
    MpiCommunicator comm(MPI_COMM_SELF);
    GradientSync sync(comm, net->parameters(), 64 * 4, 2);  // 64 floats
    ASSERT_GE(sync.num_buckets(), 4);
    sync.attach();
    if (armed)
      sync.arm();
    net->forward(x).pow(2).sum().backward();
    EXPECT_EQ(comm.stats().allreduce_calls, armed ? sync.num_buckets() - 1 : 0);
    std::vector<float> extras = {1.f, 2.f};
    sync.sync(extras);
    EXPECT_EQ(comm.stats().allreduce_calls, sync.num_buckets());
    EXPECT_EQ(sync.launched_early(), armed ? sync.num_buckets() - 1 : 0);
    EXPECT_EQ(extras, (std::vector<float>{1.f, 2.f}));
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i])) << i;
  }
}

}  // namespace
}  // namespace memtrain
