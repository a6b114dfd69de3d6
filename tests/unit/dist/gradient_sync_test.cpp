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
  const at::Tensor extras = sync.sync(torch::tensor({1.5f, 3.0f}));
  EXPECT_EQ(comm.stats().allreduce_calls, 3);
  EXPECT_EQ(comm.stats().allreduce_bytes, (145 + 2) * 4);
  EXPECT_TRUE(torch::equal(extras, torch::tensor({1.5f, 3.0f})));
  EXPECT_TRUE(torch::equal(params[1].grad(), torch::full({30}, 2.0)));
  EXPECT_TRUE(torch::equal(params[2].grad(), torch::zeros({5})));
}

// The summed gradients' inf/NaN check sets a device flag (no host read:
// Note [One host read per window]), for a NaN or an inf in any bucket.
TEST(GradientSync, NonfiniteSumsSetTheFlag) {
  MpiCommunicator comm(MPI_COMM_SELF);
  std::vector<at::Tensor> params = {torch::zeros({3000}), torch::zeros({10})};
  GradientSync sync(comm, params, 1000 * 4, 0);
  ASSERT_GE(sync.num_buckets(), 2);
  for (float bad : {0.0f, NAN, INFINITY, -INFINITY}) {
    for (size_t at : {size_t{0}, size_t{1}}) {
      sync.attach();
      params[0].mutable_grad().fill_(1.0);
      params[1].mutable_grad().fill_(2.0);
      params[at].mutable_grad()[at == 0 ? 2500 : 7] = bad;
      sync.sync(at::Tensor());
      const at::Tensor found = torch::zeros({1});
      sync.flag_nonfinite(found);
      EXPECT_EQ(found.item<float>(), bad == 0.0f ? 0.0f : 1.0f)
          << bad << " in parameter " << at;
      EXPECT_EQ(params[0].grad()[0].item<float>(), 1.0f) << "unchanged";
    }
  }
}

// A channels-last parameter's gradient is a bucket view with the
// parameter's strides (the optimizers' fast paths need one layout), and
// backward accumulates the same values into it.
TEST(GradientSync, BucketViewsKeepTheParametersLayout) {
  MpiCommunicator comm(MPI_COMM_SELF);
  torch::manual_seed(2);
  const at::Tensor w0 = torch::randn({4, 3, 3, 3});
  const at::Tensor x = torch::randn({2, 3, 6, 6});
  const at::Tensor plain = w0.clone().requires_grad_(true);
  torch::conv2d(x, plain).pow(2).sum().backward();
  const at::Tensor nhwc =
      w0.contiguous(at::MemoryFormat::ChannelsLast).requires_grad_(true);
  GradientSync sync(comm, {nhwc}, 1 << 20, 0);
  sync.attach();
  EXPECT_EQ(nhwc.grad().strides(), nhwc.strides());
  const void* view = nhwc.grad().data_ptr();
  for (int k = 0; k < 2; ++k) {
    torch::conv2d(x.contiguous(at::MemoryFormat::ChannelsLast), nhwc)
        .pow(2)
        .sum()
        .backward();
  }
  EXPECT_EQ(nhwc.grad().data_ptr(), view) << "accumulated into the bucket";
  EXPECT_EQ(nhwc.grad().strides(), nhwc.strides());
  sync.sync(at::Tensor());
  EXPECT_EQ(nhwc.grad().strides(), nhwc.strides());
  EXPECT_TRUE(torch::allclose(nhwc.grad(), 2 * plain.grad(), 1e-5, 1e-5));
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
  sync.sync(torch::zeros({2}));
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
    const at::Tensor extras = sync.sync(torch::tensor({1.f, 2.f}));
    EXPECT_EQ(comm.stats().allreduce_calls, sync.num_buckets());
    EXPECT_EQ(sync.launched_early(), armed ? sync.num_buckets() - 1 : 0);
    EXPECT_TRUE(torch::equal(extras, torch::tensor({1.f, 2.f})));
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_TRUE(torch::allclose(params[i].grad(), expected[i])) << i;
  }
}

}  // namespace
}  // namespace memtrain
