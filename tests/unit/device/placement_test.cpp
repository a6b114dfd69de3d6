// The device as a value: the placement's choice and refusals, its copies
// into the device memory domain, per-rank random streams; the window's
// shape, the totals that ride in the gradient all-reduce, and the one
// OOM halve-and-replay loop.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/device/placement.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/train/state/window_totals.h"
#include "memtrain/util/error.h"
#include "test_support.h"

namespace memtrain {
namespace {

using test::error_of;

TEST(Placement, CpuIsChosenForCpuAndAutoWithoutAGpu) {
  EXPECT_EQ(Placement::choose(DeviceChoice::kCpu, 0, "")->describe(), "cpu");
  if (!MEMTRAIN_CUDA || torch::cuda::device_count() == 0) {
    const auto p =
        Placement::choose(DeviceChoice::kAuto, 3, "expandable_segments:True");
    EXPECT_FALSE(p->is_cuda());
    EXPECT_EQ(memory::backend_name(), "cpu-accounting");
  }
}

// dist.device=auto in a CUDA build without a usable GPU (this machine's
// CUDA configuration: no driver) says why it trains on the CPU; a CPU
// build, or a machine with a GPU, says nothing.
TEST(Placement, AutoSaysWhyACudaBuildFallsBackToTheCpu) {
  const std::string why = Placement::auto_fallback_reason();
  if (!MEMTRAIN_CUDA || torch::cuda::device_count() > 0) {
    EXPECT_EQ(why, "");
    return;
  }
  EXPECT_EQ(why.rfind("dist.device=auto: this CUDA build", 0), 0u) << why;
  EXPECT_NE(why.find("CUDA runtime "), std::string::npos) << why;
  EXPECT_NE(why.find("driver"), std::string::npos) << why;
  EXPECT_NE(why.find("CUDA_VISIBLE_DEVICES="), std::string::npos) << why;
  EXPECT_NE(why.find("training on the CPU"), std::string::npos) << why;
  EXPECT_NE(why.find("dist.device=cpu"), std::string::npos) << why;
}

TEST(Placement, CudaIsRefusedByNameWhereThereIsNone) {
  if (MEMTRAIN_CUDA && torch::cuda::device_count() > 0)
    GTEST_SKIP() << "(machine) this machine has a GPU";
  const std::string msg = error_of([] {
    Placement::choose(DeviceChoice::kCuda, 0, "expandable_segments:True");
  });
  ASSERT_FALSE(msg.empty());
  EXPECT_NE(msg.find("dist.device=cuda"), std::string::npos) << msg;
  EXPECT_NE(msg.find("dist.device=cpu"), std::string::npos) << msg;
  if (!MEMTRAIN_CUDA) {
    EXPECT_NE(msg.find("CPU build (MEMTRAIN_CUDA=0"), std::string::npos) << msg;
  } else {
    EXPECT_NE(msg.find("sees no CUDA device"), std::string::npos) << msg;
  }
  // An unknown device never reaches Placement::choose: the config refuses
  // it, naming the choices.
  const std::string gpu =
      error_of([] { TrainConfig::load("", {"dist.device=gpu"}); });
  EXPECT_NE(gpu.find("one of auto, cpu, cuda"), std::string::npos) << gpu;
}

TEST(Placement, CpuCopyLandsInTheDeviceDomain) {
  const Placement& p = test::cpu_placement();
  const torch::Tensor h = torch::arange(1024, torch::kFloat32);
  const int64_t before = memory::stats().allocated;
  const torch::Tensor d = p.to_device(h);
  EXPECT_EQ(memory::stats().allocated, before + 4096);
  EXPECT_TRUE(torch::equal(d, h));
  EXPECT_NE(d.data_ptr(), h.data_ptr()) << "a copy, not the same storage";
  const torch::Tensor back = p.to_host(d);
  EXPECT_EQ(memory::stats().allocated, before + 4096);
  EXPECT_TRUE(torch::equal(back, h));
}

TEST(Placement, EachRankDrawsFromItsOwnReproducibleStream) {
  const Placement& p = test::cpu_placement();
  const RngState saved = p.rng_state();
  auto draw = [&](int rank) {
    p.seed_rng(7, rank);
    return torch::rand({64});
  };
  const torch::Tensor r0 = draw(0), r1 = draw(1), again = draw(0);
  EXPECT_TRUE(torch::equal(r0, again));
  EXPECT_FALSE(torch::equal(r0, r1));
  EXPECT_NE(rank_seed(7, 0), rank_seed(7, 1));
  EXPECT_NE(rank_seed(7, 0), rank_seed(8, 0));
  // The state round-trips: drawing after set_rng_state repeats.
  p.seed_rng(7, 1);
  const RngState mid = p.rng_state();
  const torch::Tensor a = torch::rand({16});
  p.set_rng_state(mid);
  EXPECT_TRUE(torch::equal(a, torch::rand({16})));
  p.set_rng_state(saved);
}

TEST(WindowShape, ComesFromTheConfigOnce) {
  TrainConfig c;
  c.data.batch_size = 8;
  c.training.gradient_accumulation_steps = 3;
  WindowShape s = WindowShape::for_batch(c.effective_batch(2), 2).with_micro(8);
  EXPECT_EQ(s.effective_batch, 48);
  EXPECT_EQ(s.rank_share, 24);
  EXPECT_EQ(s.accumulation_steps, 3);
  EXPECT_FALSE(s.last_micro_smaller());
  c.training.gradient_accumulation_steps = 1;
  c.training.effective_batch_size = 33;
  s = WindowShape::for_batch(c.effective_batch(2), 2).with_micro(5);
  EXPECT_EQ(s.rank_share, 17);
  EXPECT_EQ(s.accumulation_steps, 4);  // 5 + 5 + 5 + 2
  EXPECT_TRUE(s.last_micro_smaller());
  EXPECT_EQ(s.with_micro(100).micro_batch, 17) << "at most the share";
}

TEST(WindowTotals, EveryRanksFiguresSurviveTheFloatSum) {
  const int world = 3;
  const std::vector<RankWindowMemory> mem = {
      {10, 1000, (int64_t{1} << 40) + 12345, 77, 0},
      {20, 999, (int64_t{1} << 40) + 12346, 76, 2},
      {30, 1000, 5, 75, 2}};
  std::vector<float> sum(static_cast<size_t>(WindowTotals::size(world)), 0);
  std::vector<RankWindowMemory> with_host = mem;
  for (int r = 0; r < world; ++r) {
    with_host[r].rss = (int64_t{3} << 30) + 4096 * (r == 1 ? 7 : r);
    with_host[r].rss_file = (int64_t{140} << 20) + r;
    with_host[r].counted = (int64_t{1} << 30) + 512 * r;
    with_host[r].malloc_free = 8192 * r + 1;
    with_host[r].malloc_used = (int64_t{5} << 30) + 3 * r;
    with_host[r].counted_host = (int64_t{2} << 20) + 5 * r;
    with_host[r].rss_peak = (int64_t{7} << 30) + 9 * r;
  }
  for (int r = 0; r < world; ++r) {
    auto mine = WindowTotals::pack(4, r == 2, with_host[r], r, world);
    mine[WindowTotals::kLossSlot] = static_cast<float>(1.5 * (r + 1));
    for (size_t i = 0; i < sum.size(); ++i)
      sum[i] += mine[i];
  }
  const WindowTotals t = WindowTotals::unpack(sum, world);
  EXPECT_DOUBLE_EQ(t.loss_sum, 9.0);
  EXPECT_EQ(t.samples, 12);
  EXPECT_EQ(t.stop_requests, 1);
  ASSERT_EQ(t.ranks.size(), 3u);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(t.ranks[r].peak, mem[r].peak) << "exact, rank " << r;
    EXPECT_EQ(t.ranks[r].allocated, mem[r].allocated);
    EXPECT_EQ(t.ranks[r].rss, with_host[r].rss);
    EXPECT_EQ(t.ranks[r].rss_file, with_host[r].rss_file);
    EXPECT_EQ(t.ranks[r].counted, with_host[r].counted);
    EXPECT_EQ(t.ranks[r].malloc_free, with_host[r].malloc_free);
    EXPECT_EQ(t.ranks[r].malloc_used, with_host[r].malloc_used);
    EXPECT_EQ(t.ranks[r].counted_host, with_host[r].counted_host);
    EXPECT_EQ(t.ranks[r].rss_peak, with_host[r].rss_peak);
  }
  EXPECT_EQ(t.max_of(&RankWindowMemory::rss).rank, 1);
  const auto peak = t.max_of(&RankWindowMemory::peak);
  EXPECT_EQ(peak.value, (int64_t{1} << 40) + 12346);
  EXPECT_EQ(peak.rank, 1);
  const auto reserved = t.max_of(&RankWindowMemory::reserved);
  EXPECT_EQ(reserved.value, 1000);
  EXPECT_EQ(reserved.rank, 0) << "the lowest rank on a tie";
  EXPECT_EQ(t.max_of(&RankWindowMemory::oom_retries).rank, 1);
  EXPECT_EQ(t.sum_of(&RankWindowMemory::oom_retries), 4);
}

[[noreturn]] void throw_oom() {
  TORCH_CHECK_WITH(OutOfMemoryError, false, "test");
  throw 0;  // unreachable
}

TEST(OomGuard, HalvesUntilItFitsThenKeepsTheSize) {
  OomRetry how;
  how.what = "micro-batch";
  how.where = "test";
  how.replay = "the window";
  int cleanups = 0;
  how.cleanup = [&] { ++cleanups; };
  how.give_up = [](int64_t, int64_t, int64_t) {
    return std::string("gave up");
  };
  int64_t size = 16;
  std::vector<int64_t> tried;
  const int64_t retries = retry_on_oom(how, size, [&](int64_t s) {
    tried.push_back(s);
    if (s > 4)
      throw_oom();
  });
  EXPECT_EQ(retries, 2);
  EXPECT_EQ(size, 4);
  EXPECT_EQ(tried, (std::vector<int64_t>{16, 8, 4}));
  EXPECT_EQ(cleanups, 2);
  // A size above the cap halves from the cap.
  how.in_use_cap = 6;
  size = 64;
  tried.clear();
  retry_on_oom(how, size, [&](int64_t s) {
    tried.push_back(s);
    if (s > 3)
      throw_oom();
  });
  EXPECT_EQ(tried, (std::vector<int64_t>{64, 3}));
}

// Note [A failed backward's leftovers]: an out-of-memory error in a
// checkpointed backward leaves gradient buffers in the engine's queue until
// the next backward; drop_failed_backward() lets go of them.
TEST(OomGuard, FailedBackwardLeavesNothingHeld) {
  ModelConfig cfg;
  cfg.name = ModelName::kUnet3d;
  cfg.depth = 3;
  cfg.norm = Norm::kInstance;
  cfg.feature_size = 16;
  torch::manual_seed(7);
  auto net = make_unet3d(cfg, 1, 2);
  net->set_memory_lean(true);
  net->set_checkpointed(4);
  const torch::Tensor x = torch::randn({2, 1, 32, 32, 32});
  const torch::Tensor target = torch::randint(0, 2, {2, 32, 32, 32});
  int64_t ooms = 0, left_before_drop = 0;
  for (int64_t cap_mib = 6; cap_mib <= 40; cap_mib += 2) {
    memory::release_cache();
    memory::DeviceScope device;
    const int64_t before = memory::stats().allocated;
    memory::set_cap(before + cap_mib * 1024 * 1024);
    try {
      dice_ce_loss_sum(net->forward(x), target).backward();
    } catch (const c10::OutOfMemoryError&) {
      ++ooms;
      for (auto& p : net->parameters())
        p.mutable_grad() = torch::Tensor();
      left_before_drop =
          std::max(left_before_drop, memory::stats().allocated - before);
      drop_failed_backward(c10::Device(c10::kCPU));
      EXPECT_EQ(memory::stats().allocated, before) << "cap " << cap_mib;
    }
    memory::set_cap(0);
    for (auto& p : net->parameters())
      p.mutable_grad() = torch::Tensor();
  }
  EXPECT_GT(ooms, 0);
  EXPECT_GT(left_before_drop, 0) << "no leftovers: the test tests nothing";
}

TEST(OomGuard, GivesUpAtOneOrAfterMaxRetries) {
  OomRetry how;
  how.what = "batch";
  how.give_up = [](int64_t size, int64_t retries, int64_t) {
    return "gave up at " + std::to_string(size) + " after " +
           std::to_string(retries);
  };
  int64_t size = 2;
  std::string msg =
      error_of([&] { retry_on_oom(how, size, [](int64_t) { throw_oom(); }); });
  EXPECT_EQ(msg, "gave up at 1 after 1");
  how.max_retries = 0;
  size = 8;
  msg =
      error_of([&] { retry_on_oom(how, size, [](int64_t) { throw_oom(); }); });
  EXPECT_EQ(msg, "gave up at 8 after 0");
}

}  // namespace
}  // namespace memtrain
