// Host offload (Note [Host offload]): a checkpoint whose inputs wait in the
// host pool gives the gradients of full checkpointing bit for bit, holds
// less device memory, reuses its blocks, copies a shared input once, brings
// groups back one segment ahead, and refuses what it cannot do by name.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/config/choices.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_plan.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/blocks/checkpointed.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "tier_steps.h"

namespace memtrain {
namespace {

using tier_test::expect_bitwise;
using tier_test::step;
using tier_test::Step;
using tier_test::Tier;
using tier_test::unet;

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A pool of `budget` bytes (0: none) installed for the test.
class HostOffload : public ::testing::Test {
 protected:
  void SetUp() override {
    install(0);
  }
  void TearDown() override {
    memory::set_offload_pool(nullptr);
  }
  void install(int64_t budget) {
    pool = std::make_shared<memory::HostPool>(budget);
    memory::set_offload_pool(pool);
  }
  std::shared_ptr<memory::HostPool> pool;
};

// The U-Net, split decoder input (lean) or concatenated, instance or group
// norm: offload equals full checkpointing bit for bit, with less device
// memory; the host holds what the device no longer does.
TEST_F(HostOffload, UNetGradientsAreBitwiseThoseOfFullCheckpointing) {
  const tier_test::VolumeBatch batch(1, {2, 16, 16, 16});
  const torch::Tensor& x = batch.x;
  const auto loss = [&](const torch::Tensor& y) { return batch.loss(y); };
  tier_test::for_each_unet_form([&](Classifier& net) {
    const Step all = step(net, Tier::kAll, x, loss);
    const Step off = step(net, Tier::kOffload, x, loss);
    expect_bitwise(all, off, "offload vs all");
    expect_bitwise(
        step(net, Tier::kAll, x, loss, /*bf16=*/true),
        step(net, Tier::kOffload, x, loss, /*bf16=*/true),
        "offload vs all, bf16");
    EXPECT_LT(off.peak, all.peak);
    EXPECT_EQ(all.host_peak, 0);
    EXPECT_GT(off.host_peak, 0);
    EXPECT_GT(off.copied_in, 0) << "the inputs came back through copies";
    EXPECT_EQ(pool->stats().in_use, 0) << "every block is free again";
    std::printf(
        "unet3d 16^3 device peak all %ld, offload %ld; host %ld\n",
        static_cast<long>(all.peak),
        static_cast<long>(off.peak),
        static_cast<long>(off.host_peak));
  });
}

// SE-ResNeXt50's bottlenecks: the same, with the running statistics
// updated once; and under bf16 autocast the same bits as full
// checkpointing under bf16. Note [Offload that saves nothing]: offload
// must not raise its peak; where its peak is not where the segments'
// inputs are held, it need not lower it. Measured, device peak of the
// step (all / offload, bytes): LibTorch 2.11 gave equal peaks in fp32 at
// 2 x 32^2, 2 x 64^2 and 8 x 64^2 (103,447,552; 108,461,056; 128,527,360)
// and in bf16 at the first two, 162,816 B less at 8 x 64^2; LibTorch
// 1.13 gave offload's lower at every size (8 x 64^2: 128,527,360 /
// 26,764,288 fp32, 74,579,968 / 60,162,048 bf16), so there it must be.
TEST_F(HostOffload, SeResNeXtAndBf16AreBitwiseThoseOfFullCheckpointing) {
  ModelConfig cfg;
  cfg.name = ModelName::kSeresnext50;
  cfg.seed = 3;
  for (const auto& [n, side] :
       std::vector<std::pair<int64_t, int64_t>>{{2, 32}, {2, 64}, {8, 64}}) {
    auto net = make_model(cfg, {SampleKind::kImages, {3, side, side}, 5, 0});
    torch::manual_seed(5);
    const torch::Tensor x = torch::randn({n, 3, side, side});
    const torch::Tensor y = torch::randint(0, 5, {n});
    const auto loss = [&](const torch::Tensor& z) {
      return torch::nn::functional::cross_entropy(z, y);
    };
    std::map<std::string, torch::Tensor> start;
    for (const auto& b : net->named_buffers())
      start[b.key()] = b.value().clone();
    const auto buffers = [&] {
      std::map<std::string, torch::Tensor> now;
      for (const auto& b : net->named_buffers())
        now[b.key()] = b.value().clone();
      torch::NoGradGuard no_grad;
      for (const auto& b : net->named_buffers())
        b.value().copy_(start.at(b.key()));
      return now;
    };
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(
          std::string(bf16 ? "bf16, " : "fp32, ") + std::to_string(n) + " x " +
          std::to_string(side));
      const Step all = step(*net, Tier::kAll, x, loss, bf16);
      const auto after_all = buffers();
      const Step off = step(*net, Tier::kOffload, x, loss, bf16);
      const auto after_off = buffers();
      expect_bitwise(all, off, "offload vs all");
      for (const auto& [name, b] : after_all)
        EXPECT_TRUE(torch::equal(b, after_off.at(name))) << name;
      EXPECT_LE(off.peak, all.peak);
#if !MEMTRAIN_TORCH_AT_LEAST(2, 0)
      if (n == 8)
        EXPECT_LT(off.peak, all.peak);
#endif
      EXPECT_GT(off.copied_in, 0);
      std::printf(
          "seresnext50 %ldx%ldx%ld %s device peak all %ld, offload %ld\n",
          static_cast<long>(n),
          static_cast<long>(side),
          static_cast<long>(side),
          bf16 ? "bf16" : "fp32",
          static_cast<long>(all.peak),
          static_cast<long>(off.peak));
    }
  }
}

// The feature MLP and the small CNN: their segments offload too.
TEST_F(HostOffload, MlpAndCnnAreBitwiseThoseOfFullCheckpointing) {
  ModelConfig mlp;
  mlp.hidden = 32;
  mlp.depth = 4;
  ModelConfig cnn;
  cnn.name = ModelName::kCnn;
  cnn.hidden = 4;
  cnn.depth = 3;
  cnn.norm = Norm::kGroup;
  struct Case {
    std::shared_ptr<Classifier> net;
    torch::Tensor x;
  };
  torch::manual_seed(2);
  const std::vector<Case> cases = {
      {make_model(mlp, {SampleKind::kFeatures, {16}, 3, 0}),
       torch::randn({8, 16})},
      {make_model(cnn, {SampleKind::kImages, {2, 16, 16}, 3, 0}),
       torch::randn({8, 2, 16, 16})}};
  const torch::Tensor y = torch::randint(0, 3, {8});
  const auto loss = [&](const torch::Tensor& z) {
    return torch::nn::functional::cross_entropy(z, y);
  };
  for (const Case& c : cases) {
    const Step all = step(*c.net, Tier::kAll, c.x, loss);
    const Step off = step(*c.net, Tier::kOffload, c.x, loss);
    expect_bitwise(all, off, "offload vs all");
    EXPECT_GT(off.host_peak, 0);
    EXPECT_GT(off.copied_in, 0);
  }
}

// Blocks are reserved in the first step and reused by every later one: the
// pool does not grow, and nothing stays in use between steps.
TEST_F(HostOffload, BlocksAreReusedAcrossSteps) {
  auto net = unet(Norm::kInstance, true);
  torch::manual_seed(3);
  const torch::Tensor target = torch::randint(0, 3, {2, 16, 16, 16});
  const auto loss = [&](const torch::Tensor& y) {
    return dice_ce_loss_sum(y, target.narrow(0, 0, y.size(0)));
  };
  step(*net, Tier::kOffload, torch::randn({2, 1, 16, 16, 16}), loss);
  const memory::HostPoolStats first = pool->stats();
  EXPECT_GT(first.grows, 0);
  EXPECT_EQ(first.reserved, first.peak_in_use);
  for (int i = 0; i < 5; ++i)
    step(*net, Tier::kOffload, torch::randn({2, 1, 16, 16, 16}), loss);
  const memory::HostPoolStats later = pool->stats();
  EXPECT_EQ(later.grows, first.grows);
  EXPECT_EQ(later.reserved, first.reserved);
  EXPECT_EQ(later.in_use, 0);
  // A smaller micro-batch fits in the blocks already there.
  step(*net, Tier::kOffload, torch::randn({1, 1, 16, 16, 16}), loss);
  EXPECT_EQ(pool->stats().grows, first.grows);
  // trim() gives the free blocks back.
  EXPECT_EQ(pool->trim(), first.reserved);
  EXPECT_EQ(pool->stats().reserved, 0);
}

// A tensor two groups offload is copied once; it comes back for each, and
// its block is free after the last. A group done brings the group before
// it back (one segment ahead); taking that one copies nothing more.
TEST_F(HostOffload, SharedInputsOnceAndOneSegmentAhead) {
  memory::DeviceScope device;
  torch::Tensor a = torch::randn({64, 64});  // 16 KiB
  torch::Tensor b = torch::randn({32, 64});  // 8 KiB
  const torch::Tensor a0 = a.clone(), b0 = b.clone();
  const int64_t a_bytes = 64 * 64 * 4, b_bytes = 32 * 64 * 4;
  auto first = pool->offload({a});
  auto second = pool->offload({b, a});  // a again: shared
  a = b = torch::Tensor();              // only the pool has them now
  memory::HostPoolStats s = pool->stats();
  EXPECT_EQ(s.copied_out, a_bytes + b_bytes);
  EXPECT_EQ(s.in_use, a_bytes + b_bytes);
  const std::vector<torch::Tensor> back = second->take();
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(torch::equal(back[0], b0));
  EXPECT_TRUE(torch::equal(back[1], a0));
  EXPECT_EQ(pool->stats().copied_in, b_bytes + a_bytes);
  second->prefetch_ahead();  // second's segment is done
  s = pool->stats();
  // second's two, and first's a ahead of its turn.
  EXPECT_EQ(s.copied_in, b_bytes + 2 * a_bytes);
  EXPECT_EQ(s.in_use, a_bytes) << "b's block is free; first still holds a";
  const std::vector<torch::Tensor> early = first->take();
  ASSERT_EQ(early.size(), 1u);
  EXPECT_TRUE(torch::equal(early[0], a0));
  EXPECT_EQ(pool->stats().copied_in, s.copied_in) << "no second copy";
  EXPECT_EQ(pool->stats().in_use, 0);
}

// Sizes, strides and dtype come back as they went: a channels-last tensor
// keeps its layout; a tensor that is not dense comes back contiguous with
// the same values; an empty one comes back empty.
TEST_F(HostOffload, LayoutAndValuesComeBack) {
  memory::DeviceScope device;
  const torch::Tensor cl =
      torch::randn({2, 3, 4, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  const torch::Tensor base = torch::randn({6, 8});
  const torch::Tensor strided = base.t().narrow(0, 1, 4);
  const torch::Tensor half = torch::randn({5, 7}).to(torch::kBFloat16);
  const torch::Tensor empty = torch::empty({0, 3});
  std::shared_ptr<memory::OffloadGroup> g;
  {
    // Offloaded copies of them: the pool's are the only references.
    const std::vector<torch::Tensor> copies = {
        cl.clone(torch::MemoryFormat::Preserve),
        base.clone().t().narrow(0, 1, 4),
        half.clone(),
        empty.clone()};
    EXPECT_EQ(copies[0].strides(), cl.strides());
    EXPECT_FALSE(copies[1].is_contiguous());
    g = pool->offload(copies);
  }
  const std::vector<torch::Tensor> back = g->take();
  EXPECT_GT(pool->stats().copied_in, 0);
  ASSERT_EQ(back.size(), 4u);
  EXPECT_TRUE(torch::equal(back[0], cl));
  EXPECT_EQ(back[0].strides(), cl.strides());
  EXPECT_TRUE(torch::equal(back[1], strided));
  EXPECT_TRUE(back[1].is_contiguous());
  EXPECT_TRUE(torch::equal(back[2], half));
  EXPECT_EQ(back[2].scalar_type(), torch::kBFloat16);
  EXPECT_EQ(back[3].sizes(), empty.sizes());
}

// A tensor that something else kept alive is used as it is when its group
// needs it: no copy back, no second device copy.
TEST_F(HostOffload, ATensorStillAliveComesBackWithoutACopy) {
  memory::DeviceScope device;
  const torch::Tensor kept = torch::randn({16, 16});
  const std::vector<torch::Tensor> back = pool->offload({kept})->take();
  EXPECT_TRUE(back[0].is_alias_of(kept));
  EXPECT_EQ(pool->stats().copied_in, 0);
  EXPECT_EQ(pool->stats().still_on_device, 1);
}

// Offloaded bytes leave the device domain: what a group holds is host
// memory until it comes back.
TEST_F(HostOffload, OffloadedBytesAreHostMemory) {
  memory::release_cache();
  std::shared_ptr<memory::OffloadGroup> g;
  int64_t device_before = 0, host_before = 0;
  {
    memory::DeviceScope device;
    torch::Tensor x = torch::randn({256, 256});  // 256 KiB
    device_before = memory::stats().allocated;
    host_before = memory::stats().host_allocated;
    g = pool->offload({x});
    x = torch::Tensor();
    EXPECT_EQ(memory::stats().allocated, device_before - 256 * 256 * 4);
    EXPECT_EQ(memory::stats().host_allocated, host_before + 256 * 256 * 4);
    const std::vector<torch::Tensor> back = g->take();
    EXPECT_EQ(memory::stats().allocated, device_before);
  }
}

// An input changed in place after it was offloaded would come back with
// the old values: refused by name, as SavedVariable refuses it without
// offload.
TEST_F(HostOffload, InputChangedInPlaceIsRefused) {
  torch::manual_seed(6);
  const torch::Tensor w = torch::randn({8, 8}, torch::requires_grad());
  torch::Tensor x = torch::randn({4, 8}, torch::requires_grad()) * 1.0;
  const torch::Tensor y = checkpoint(
      [&](const at::Tensor& t) { return torch::tanh(t.matmul(w)); },
      x,
      Recompute::kAllOffload);
  {
    torch::NoGradGuard no_grad;
    x.mul_(2.0);
  }
  const std::string what = message_of([&] { y.sum().backward(); });
  EXPECT_NE(what.find("modified in place"), std::string::npos) << what;
}

// Past memory.host_budget: HostBudgetExceeded, naming the budget and the
// key; the pool holds nothing more.
TEST_F(HostOffload, BudgetIsAHardLimitNamedInTheError) {
  install(40 * 1024);
  memory::DeviceScope device;
  const torch::Tensor a = torch::randn({64, 64});   // 16 KiB
  const torch::Tensor b = torch::randn({128, 64});  // 32 KiB
  auto g = pool->offload({a});
  try {
    pool->offload({b});
    FAIL() << "no error";
  } catch (const memory::HostBudgetExceeded& e) {
    const std::string what = e.what();
    EXPECT_NE(
        what.find("offload pool's cap (40.0 KiB: what memory.host_budget"),
        std::string::npos)
        << what;
    EXPECT_NE(what.find("[128, 64]"), std::string::npos) << what;
  }
  EXPECT_EQ(pool->stats().reserved, 16 * 1024);
  EXPECT_EQ(pool->stats().in_use, 16 * 1024);
  // Once a's block is free, b's new block first frees it: 16 + 32 KiB
  // would pass the budget, 32 KiB alone does not.
  g.reset();
  EXPECT_NO_THROW(pool->offload({b}));
  EXPECT_EQ(pool->stats().reserved, 32 * 1024);
}

// auto: the job's memory less a margin (5%, at least 256 MiB, at most
// half), shared out by the node's ranks.
TEST(HostBudget, AutoIsTheJobsMemoryLessAMarginOverItsRanks) {
  const int64_t gib = int64_t{1} << 30;
  const int64_t mib = int64_t{1} << 20;
  EXPECT_EQ(memory::host_margin_bytes(64 * gib), 64 * gib / 20);
  EXPECT_EQ(memory::host_margin_bytes(2 * gib), 256 * mib);
  EXPECT_EQ(memory::host_margin_bytes(300 * mib), 150 * mib);
  JobMemory node;
  node.bytes = 64 * gib;
  node.source = "physical memory";
  std::string why;
  EXPECT_EQ(
      memory::host_budget_bytes("auto", node, 4, false, -1, &why),
      (64 * gib - 64 * gib / 20) / 4);
  EXPECT_EQ(
      why,
      "auto: 64.0 GiB (physical memory) less a margin of 3.2 GiB, over 4 "
      "ranks on this node");
  // Pinned blocks: a lower ulimit -l is reported, not applied (CUDA pins
  // through its driver, not mlock).
  memory::host_budget_bytes("auto", node, 4, true, gib, &why);
  EXPECT_NE(why.find("ulimit -l is 1.0 GiB"), std::string::npos) << why;
  EXPECT_EQ(
      memory::host_budget_bytes("3GiB", node, 4, true, -1, &why), 3 * gib);
  EXPECT_EQ(why, "memory.host_budget=3GiB");
  const std::string unknown = message_of([&] {
    memory::host_budget_bytes("auto", JobMemory{}, 1, false, -1, nullptr);
  });
  EXPECT_NE(unknown.find("set memory.host_budget"), std::string::npos);
}

TEST(HostBudget, GradientCheckpointingOffloadIsAChoice) {
  EXPECT_EQ(choice_of<Checkpointing>("offload"), Checkpointing::kOffload);
}

}  // namespace
}  // namespace memtrain
