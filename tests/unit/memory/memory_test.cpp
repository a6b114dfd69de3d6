// The memory area on the CPU build: budget parsing, the accounting
// allocator's domains, cache and cap, the planner's search, the leak
// detector.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memtrain/config/memory_size.h"
#include "memtrain/memory/allocator_conf.h"
#include "memtrain/memory/block_pool.h"
#include "memtrain/memory/budget.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/monitor.h"
#include "memtrain/memory/planner.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

TEST(Budget, ProfilesSizesAndErrors) {
  EXPECT_EQ(resolve_budget("v100-16gb", 0.1).bytes, int64_t{16160} << 20);
  EXPECT_EQ(resolve_budget("512MiB", 0).bytes, int64_t{512} << 20);
  EXPECT_EQ(resolve_budget("1.5GiB", 0).bytes, int64_t{3} << 29);
  EXPECT_EQ(resolve_budget("16GB", 0).bytes, int64_t{16000000000});
  EXPECT_EQ(resolve_budget("1900000", 0).bytes, 1900000);
  EXPECT_FALSE(resolve_budget("none", 0).limited());
  Budget b = resolve_budget("100MiB", 0.25);
  EXPECT_EQ(b.usable(), int64_t{75} << 20);
  // What the process holds outside the allocator (CUDA) is the budget's too.
  b.outside = int64_t{5} << 20;
  EXPECT_EQ(b.usable(), int64_t{70} << 20);
  EXPECT_EQ(b.allocator_cap(), int64_t{95} << 20);
  b.outside = int64_t{200} << 20;
  EXPECT_EQ(b.usable(), 0);
  EXPECT_EQ(resolve_budget("none", 0).allocator_cap(), 0);
  try {
    resolve_budget("v100", 0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("v100-16gb"), std::string::npos);
  }
  EXPECT_THROW(resolve_budget("12 parsecs", 0), Error);
  EXPECT_THROW(resolve_budget("-5MiB", 0), Error);
  // 2^63 bytes and more would wrap negative in an int64_t; under a byte
  // would be none.
  EXPECT_EQ(parse_memory_size("9223372036854774784"), 9223372036854774784);
  for (const char* text :
       {"9223372036854775808",
        "10000000000000000000",
        "8388608TiB",
        "1e300",
        "0.4"}) {
    try {
      parse_memory_size(text);
      ADD_FAILURE() << text << " was taken";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos)
          << e.what();
    }
  }
}

class AccountingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    memory::release_cache();
    memory::set_cap(0);
    memory::reset_peak();
  }
  void TearDown() override {
    memory::set_cap(0);
    memory::release_cache();
  }
};

TEST_F(AccountingTest, DomainsFollowScopes) {
  ASSERT_TRUE(memory::accounting_installed());
  const memory::Stats before = memory::stats();
  torch::Tensor host = torch::empty({1000});  // outside any scope: host
  EXPECT_EQ(memory::stats().allocated, before.allocated);
  EXPECT_GE(memory::stats().host_allocated, before.host_allocated + 4000);
  torch::Tensor dev;
  {
    memory::DeviceScope device;
    dev = torch::empty({1000});  // 4000 bytes, rounded up to 4096
    torch::Tensor h;
    {
      memory::HostScope hs;
      h = torch::empty({1000});
    }
    EXPECT_EQ(memory::stats().allocated, before.allocated + 4096);
  }
  // The domain is decided at allocation: freeing outside the scope returns
  // the bytes to the device domain's cache.
  dev = torch::Tensor();
  const memory::Stats s = memory::stats();
  EXPECT_EQ(s.allocated, before.allocated);
  // Its segment stays reserved (a new one, or room in one already held)
  // until the cache is released.
  const int64_t grown = s.reserved - before.reserved;
  EXPECT_TRUE(grown == 0 || grown == memory::BlockPool::kSmallSegment) << grown;
  EXPECT_EQ(memory::release_cache(), grown);
  EXPECT_EQ(memory::stats().reserved, before.reserved);
}

TEST_F(AccountingTest, CachedBlocksAreReusedAndPeakResets) {
  memory::DeviceScope device;
  { torch::Tensor first = torch::empty({256, 256}); }
  const int64_t base = memory::stats().reserved;
  for (int i = 0; i < 5; ++i) {
    torch::Tensor t = torch::empty({256 - i, 256});  // the cached block
  }
  EXPECT_EQ(memory::stats().reserved, base);
  memory::reset_peak();
  EXPECT_EQ(memory::stats().peak_allocated, memory::stats().allocated);
  {
    torch::Tensor a = torch::empty({1024});
    torch::Tensor b = torch::empty({1024});
  }
  EXPECT_EQ(
      memory::stats().peak_allocated - memory::stats().allocated, 2 * 4096);
}

TEST_F(AccountingTest, CapThrowsLibTorchOutOfMemoryAndUnwindsCleanly) {
  memory::DeviceScope device;
  const int64_t base = memory::stats().allocated;
  // Room for 4 MiB of segments, not for the graph.
  memory::set_cap(memory::stats().reserved + (int64_t{4} << 20));
  torch::Tensor w = torch::randn({256, 256}, torch::requires_grad());
  EXPECT_THROW(
      {
        // A graph whose activations pass 4 MiB (1 MiB each).
        torch::Tensor x = torch::randn({1024, 256});
        for (int i = 0; i < 8; ++i)
          x = torch::tanh(x.matmul(w));
        x.sum().backward();
      },
      c10::OutOfMemoryError);
  EXPECT_GE(memory::stats().num_ooms, 1);
  w = torch::Tensor();
  // Everything the failed forward held is back (in the cache or freed).
  EXPECT_EQ(memory::stats().allocated, base);
}

// A synthetic memory curve: fixed part + per-sample activations, reduced
// by checkpointing: each whole segment drops 80/segments of 100 per sample;
// every segment selective drops 10; every segment offloaded drops 90 (10
// left), moving 70 per sample to the host.
ProbeFn curve(int64_t budget, int64_t segments, int64_t* calls) {
  return [=](int64_t micro, const Tier& tier) {
    ++*calls;
    const int64_t act =
        micro * (tier.offload     ? 10
                 : tier.selective ? 90
                                  : 100 - 80 * tier.segments / segments);
    const int64_t peak = 1000 + act;
    ProbeResult r{peak <= budget, peak, 0.0, false};
    r.host_bytes = tier.offload ? 70 * micro : 0;
    return r;
  };
}

// The same memory, and a time per sample that falls with the micro-batch
// (1 + 4 / m) and rises with checkpointing: selective by 5%, s whole
// segments by whole_cost * s / segments, offload by that and offload_cost.
ProbeFn timed_curve(
    int64_t budget,
    int64_t segments,
    double whole_cost,
    int64_t* calls,
    double offload_cost = 0.2) {
  const ProbeFn memory = curve(budget, segments, calls);
  return [=](int64_t micro, const Tier& tier) {
    ProbeResult r = memory(micro, tier);
    const double cost = tier.selective
                            ? 0.05
                            : whole_cost * tier.segments / segments +
                                  (tier.offload ? offload_cost : 0.0);
    r.seconds_per_sample = (1.0 + cost) * (1.0 + 4.0 / micro);
    return r;
  };
}

// Note [A budget is the whole process]: on the CPU there is nothing outside
// the accounting allocator, and the device's own figure is unknown, so the
// window-boundary check never fires.
TEST_F(AccountingTest, CpuHasNothingOutsideAndNoDeviceFigure) {
  EXPECT_EQ(memory::measure_outside(), 0);
  EXPECT_EQ(memory::device_used_bytes(), -1);
  EXPECT_NO_THROW(
      memory::check_device_within(1, 0, "memory.budget=1"));  // unknown
}

std::string refusal(const std::string& conf, const std::string& env) {
  try {
    memory::merge_allocator_conf(conf, env, "PYTORCH_CUDA_ALLOC_CONF");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// memory.allocator_conf and the user's PYTORCH_CUDA_ALLOC_CONF: merged key
// by key, the environment winning; each key says where it came from.
TEST(AllocatorConf, EnvironmentWinsKeyByKey) {
  const memory::AllocatorSettings m = memory::merge_allocator_conf(
      "expandable_segments:True,garbage_collection_threshold:0.6",
      "garbage_collection_threshold:0.8,"
      "roundup_power2_divisions:[256:1,512:2,>:8]",
      "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(
      m.text(),
      "expandable_segments:True,garbage_collection_threshold:0.8,"
      "roundup_power2_divisions:[256:1,512:2,>:8]");
  ASSERT_EQ(m.entries.size(), 3u);
  EXPECT_EQ(m.entries[0].from, "memory.allocator_conf");
  EXPECT_EQ(m.entries[1].from, "PYTORCH_CUDA_ALLOC_CONF");
  EXPECT_EQ(m.entries[2].from, "PYTORCH_CUDA_ALLOC_CONF");
  // The user's keys survive a config that sets others, and an empty side
  // changes nothing.
  EXPECT_EQ(
      memory::merge_allocator_conf("", "max_split_size_mb:512", "X").text(),
      "max_split_size_mb:512");
  EXPECT_EQ(
      memory::merge_allocator_conf(" expandable_segments : True ,", "", "")
          .text(),
      "expandable_segments:True");
  // The environment may turn expandable segments off and then split.
  EXPECT_EQ(
      memory::merge_allocator_conf(
          "expandable_segments:True",
          "expandable_segments:False,max_split_size_mb:256",
          "PYTORCH_CUDA_ALLOC_CONF")
          .text(),
      "expandable_segments:False,max_split_size_mb:256");
}

TEST(AllocatorConf, RefusalsNameTheCauseAndTheFix) {
  // expandable segments with max_split_size_mb, wherever each came from.
  const std::string both =
      refusal("expandable_segments:True", "max_split_size_mb:512");
  EXPECT_NE(both.find("123548"), std::string::npos) << both;
  EXPECT_NE(
      both.find("max_split_size_mb:512 (from PYTORCH_CUDA_ALLOC_CONF)"),
      std::string::npos)
      << both;
  EXPECT_NE(
      both.find("expandable_segments:True (from memory.allocator_conf)"),
      std::string::npos)
      << both;
  EXPECT_NE(refusal("expandable_segments:True,max_split_size_mb:64", ""), "");
  // Malformed text names the variable and the entry.
  const std::string bare = refusal("", "expandable_segments");
  EXPECT_NE(bare.find("PYTORCH_CUDA_ALLOC_CONF"), std::string::npos) << bare;
  EXPECT_NE(
      bare.find("'expandable_segments' is not key:value"), std::string::npos)
      << bare;
  EXPECT_NE(
      refusal("roundup_power2_divisions:[256:1", "").find("'['"),
      std::string::npos);
  EXPECT_NE(refusal("a:1,a:2", "").find("a is given twice"), std::string::npos);
}

// Note [Planning the extraction chunk]: doubled, then bisected; every
// unit when they all fit; 1 when nothing more does; each n asked once.
TEST(Planner, LargestChunkDoublesThenBisects) {
  std::vector<int64_t> asked;
  const auto upto = [&asked](int64_t most) {
    return [&asked, most](int64_t n) {
      asked.push_back(n);
      return n <= most;
    };
  };
  EXPECT_EQ(largest_chunk(64, upto(23)), 23);
  EXPECT_EQ(asked, (std::vector<int64_t>{2, 4, 8, 16, 32, 24, 20, 22, 23}));
  asked.clear();
  EXPECT_EQ(largest_chunk(48, upto(100)), 48);
  EXPECT_EQ(asked, (std::vector<int64_t>{2, 4, 8, 16, 32, 48}));
  asked.clear();
  EXPECT_EQ(largest_chunk(48, upto(40)), 40);
  asked.clear();
  EXPECT_EQ(largest_chunk(16, upto(1)), 1);
  EXPECT_EQ(asked, (std::vector<int64_t>{2}));
  asked.clear();
  EXPECT_EQ(largest_chunk(1, upto(0)), 1);
  EXPECT_TRUE(asked.empty());
}

TEST(Planner, AutoFindsLargestFittingDivisor) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 64;
  req.fixed_micro = 0;
  req.checkpointing = Checkpointing::kOff;
  req.num_segments = 4;
  // 1000 + 100 m <= 4000 -> m <= 30; largest divisor of 64 <= 30 is 16
  // (16 >= 30/2, so it is taken): 16 x 4 steps = 64.
  const MemoryPlan p = plan_memory(req, curve(4000, 4, &calls));
  EXPECT_EQ(p.micro_batch, 16);
  EXPECT_EQ(p.accumulation_steps, 4);
  EXPECT_EQ(p.checkpointed_segments, 0);
  EXPECT_EQ(p.predicted_peak, 1000 + 16 * 100);
  EXPECT_LE(calls, 12);  // doubling + bisection, each probe once
}

TEST(Planner, KeepsLargestWhenDivisorsAreTooSmall) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 37;  // prime: the only divisors are 1 and 37
  req.checkpointing = Checkpointing::kOff;
  req.num_segments = 1;
  const MemoryPlan p = plan_memory(req, curve(3000, 1, &calls));
  EXPECT_EQ(p.micro_batch, 20);        // 1000 + 100 m <= 3000
  EXPECT_EQ(p.accumulation_steps, 2);  // 20 + 17
}

TEST(Planner, AutoCheckpointingTakesFewestSegments) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  // All 4 checkpointed: 1000 + 20 m -> m = 32 fits 2000 (1640).
  // m = 32 with s segments: 1000 + 32 (100 - 20 s) <= 2000 -> s >= 3.45.
  const MemoryPlan p = plan_memory(req, curve(2000, 4, &calls));
  EXPECT_EQ(p.micro_batch, 32);
  EXPECT_EQ(p.checkpointed_segments, 4);
  // 3000: s = 2 gives 1000 + 32 * 60 = 2920, s = 1 gives 3560; every
  // segment selective 3880.
  const MemoryPlan q = plan_memory(req, curve(3000, 4, &calls));
  EXPECT_EQ(q.micro_batch, 32);
  EXPECT_EQ(q.checkpointed_segments, 2);
  EXPECT_FALSE(q.selective);
}

// Note [Planning]: every micro-batch a window runs must fit with the
// chosen tier, the tail of a share too, however small: on the CPU one
// sample can need more than many (LibTorch's im2col convolution).
PlanRequest::WindowSizes tail_of(int64_t share) {
  return [share](int64_t micro) {
    std::vector<int64_t> sizes;
    if (share % micro != 0)
      sizes.push_back(share % micro);
    return sizes;
  };
}

TEST(Planner, TheTailOfAShareFitsTheChosenTier) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 33;  // 32 + a tail of 1
  req.fixed_micro = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  req.window_micro_batches = tail_of(33);
  const ProbeFn memory = curve(3000, 4, &calls);
  // One sample costs 2500 more unless every segment is checkpointed.
  const ProbeFn probe = [&](int64_t micro, const Tier& tier) {
    ProbeResult r = memory(micro, tier);
    if (micro == 1 && tier.segments < 4) {
      r.peak += 2500;
      r.fits = r.peak <= 3000;
    }
    return r;
  };
  const MemoryPlan p = plan_memory(req, probe);
  // 32 fits with 2 whole segments (2920), but its tail of 1 needs 3560
  // there and 3540 with 3; with 4 both fit (1640, 1020).
  EXPECT_EQ(p.micro_batch, 32);
  EXPECT_EQ(p.checkpointed_segments, 4);
  EXPECT_FALSE(p.selective);
  EXPECT_FALSE(p.offload);
  EXPECT_EQ(p.window_micro_batches, (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(p.predicted_peak, 1640);
  // Without the tail's probes, 2 segments (the window of 1 would run out).
  req.window_micro_batches = nullptr;
  EXPECT_EQ(plan_memory(req, probe).checkpointed_segments, 2);
}

TEST(Planner, ATailThatFitsNoTierTakesASmallerMicroBatch) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 37;  // prime: 20 + 17
  req.checkpointing = Checkpointing::kOff;
  req.num_segments = 1;
  req.window_micro_batches = tail_of(37);
  const ProbeFn memory = curve(3000, 1, &calls);
  const ProbeFn probe = [&](int64_t micro, const Tier& tier) {
    ProbeResult r = memory(micro, tier);
    if (micro == 17) {
      r.peak += 1500;
      r.fits = false;
    }
    return r;
  };
  const MemoryPlan p = plan_memory(req, probe);
  EXPECT_EQ(p.micro_batch, 19);  // 19 + 18
  EXPECT_EQ(p.accumulation_steps, 2);
  EXPECT_EQ(p.window_micro_batches, (std::vector<int64_t>{19, 18}));
  EXPECT_EQ(p.predicted_peak, 1000 + 19 * 100);
  EXPECT_NE(p.note.find("does not fit, using 19"), std::string::npos) << p.note;
}

// Note [Planning]: auto's tiers, cheapest in time first.
TEST(Planner, TierLadders) {
  const auto ladder = tier_ladder(Checkpointing::kAuto, 3);
  ASSERT_EQ(ladder.size(), 6u);
  EXPECT_EQ(ladder[0].segments, 0);
  EXPECT_TRUE(ladder[1].selective);
  EXPECT_EQ(ladder[1].segments, 3);
  for (int64_t s = 1; s <= 3; ++s) {
    EXPECT_EQ(ladder[static_cast<size_t>(s + 1)].segments, s);
    EXPECT_FALSE(ladder[static_cast<size_t>(s + 1)].selective);
    EXPECT_FALSE(ladder[static_cast<size_t>(s + 1)].offload);
  }
  EXPECT_TRUE(ladder[5].offload);
  EXPECT_EQ(ladder[5].segments, 3);
  EXPECT_FALSE(ladder[5].selective);
  EXPECT_EQ(tier_ladder(Checkpointing::kOff, 3).size(), 1u);
  EXPECT_EQ(tier_ladder(Checkpointing::kAll, 3).back().segments, 3);
  EXPECT_TRUE(tier_ladder(Checkpointing::kSelective, 3).back().selective);
  EXPECT_TRUE(tier_ladder(Checkpointing::kOffload, 3).back().offload);
  EXPECT_EQ(tier_ladder(Checkpointing::kOffload, 3).size(), 1u);
  EXPECT_EQ(tier_ladder(Checkpointing::kAuto, 0).size(), 1u);
  EXPECT_TRUE(ladder_offloads(Checkpointing::kAuto, 3));
  EXPECT_FALSE(ladder_offloads(Checkpointing::kAll, 3));
  EXPECT_FALSE(ladder_offloads(Checkpointing::kAuto, 0));
  EXPECT_EQ(describe(ladder[0], 3), "0/3 segments");
  EXPECT_EQ(describe(ladder[1], 3), "3/3 segments selective");
  EXPECT_EQ(describe(ladder[3], 3), "2/3 segments whole");
  EXPECT_EQ(describe(ladder[5], 3), "3/3 segments whole + offload");
}

// A budget below every segment whole's peak and above offload's: auto
// goes down the ladder to offload, and records its host bytes.
TEST(Planner, AutoOffloadsWhenEvenEverySegmentWholeDoesNotFit) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.fixed_micro = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  // 4 whole: 1000 + 32 * 20 = 1640; offload 1320.
  const MemoryPlan p = plan_memory(req, curve(1500, 4, &calls));
  EXPECT_TRUE(p.fits);
  EXPECT_TRUE(p.offload);
  EXPECT_EQ(p.tier_index, 6);
  EXPECT_EQ(p.checkpointed_segments, 4);
  EXPECT_EQ(p.predicted_peak, 1320);
  EXPECT_EQ(p.predicted_host_bytes, 70 * 32);
  ASSERT_EQ(p.probes.size(), 7u);  // every tier, cheapest first
  EXPECT_TRUE(p.probes.back().tier.offload);
  EXPECT_EQ(p.probes.back().host_bytes, 70 * 32);
  // Above the whole tier's peak, offload is never probed.
  const MemoryPlan q = plan_memory(req, curve(1700, 4, &calls));
  EXPECT_FALSE(q.offload);
  EXPECT_EQ(q.checkpointed_segments, 4);
  for (const auto& probe : q.probes)
    EXPECT_FALSE(probe.tier.offload);
}

// memory.host_budget limits offload alone: a host pool too small for it
// leaves the tiers on the device to plan as before, and only where nothing
// else fits is the refusal about the host budget.
TEST(Planner, AHostBudgetTooSmallForOffloadLimitsOnlyOffload) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  const auto without_host = [&calls](int64_t budget) -> ProbeFn {
    const ProbeFn device = curve(budget, 4, &calls);
    return [device](int64_t micro, const Tier& tier) {
      ProbeResult r = device(micro, tier);
      if (tier.offload) {
        r.fits = false;
        r.host_exceeded = true;
      }
      return r;
    };
  };
  // 4 whole segments fit up to 25 (1500): 16, dividing 32.
  const MemoryPlan p = plan_memory(req, without_host(1500));
  EXPECT_FALSE(p.offload);
  EXPECT_EQ(p.micro_batch, 16);
  EXPECT_EQ(p.checkpointed_segments, 4);
  // Only offload would fit one sample on the device (1010 <= 1015).
  try {
    plan_memory(req, without_host(1015));
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("passed memory.host_budget"), std::string::npos)
        << what;
    EXPECT_NE(what.find("or memory.host_budget"), std::string::npos) << what;
  }
}

// Note [Planning]: offload's larger micro-batch is kept only when it is
// faster per sample than every segment whole at its own largest one.
TEST(Planner, OffloadOnlyWhenFasterPerSampleThanWholeAtItsMicroBatch) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  // 1500: offload fits 32 (1320); 4 whole up to 25 -> 16 (divides 32).
  // Dear offload: 1.5 x 1.125 = 1.69 per sample against whole's
  // 1.3 x 1.25 = 1.625: whole at 16.
  const MemoryPlan dear =
      plan_memory(req, timed_curve(1500, 4, 0.3, &calls, 0.2));
  EXPECT_FALSE(dear.offload);
  EXPECT_EQ(dear.micro_batch, 16);
  EXPECT_EQ(dear.checkpointed_segments, 4);
  EXPECT_EQ(dear.memory_micro_batch, 32);  // the plan by memory offloads
  EXPECT_EQ(dear.memory_tier_index, 6);
  // Both were probed and fit at 1, 2, 4, 8 and 16 (offload's search
  // doubled on to 32): offload saved (20 - 10) x 16 at 16.
  ASSERT_TRUE(dear.offload_saving.has_value());
  EXPECT_EQ(*dear.offload_saving, 160);
  EXPECT_EQ(dear.offload_saving_micro, 16);
  EXPECT_EQ(dear.note.find("saves nothing"), std::string::npos) << dear.note;
  // Free offload: 1.3 x 1.125 = 1.46: offload at 32.
  const MemoryPlan free =
      plan_memory(req, timed_curve(1500, 4, 0.3, &calls, 0.0));
  EXPECT_TRUE(free.offload);
  EXPECT_EQ(free.micro_batch, 32);
}

// Note [Offload that saves nothing]: a model whose offload peak is every
// segment whole's gets no larger micro-batch from it, and the plan says
// so, with both peaks; a search that never probed the two at one
// micro-batch records nothing.
TEST(Planner, OffloadThatSavesNothingIsSaid) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  const ProbeFn same = [&calls](int64_t micro, const Tier& tier) {
    ProbeResult r = curve(1500, 4, &calls)(micro, tier);
    if (tier.offload) {  // every segment whole's peak: 1000 + 20 per sample
      r.peak = 1000 + 20 * micro;
      r.fits = r.peak <= 1500;
    }
    return r;
  };
  const MemoryPlan p = plan_memory(req, same);
  EXPECT_FALSE(p.offload);
  EXPECT_EQ(p.micro_batch, 16);  // 25 fits; 16 divides 32
  ASSERT_TRUE(p.offload_saving.has_value());
  EXPECT_EQ(*p.offload_saving, 0);
  EXPECT_EQ(p.offload_saving_micro, 25);
  EXPECT_NE(
      p.note.find("offload saves nothing at micro-batch 25 (peak 1.5 KiB "
                  "against 1.5 KiB with every segment whole)"),
      std::string::npos)
      << p.note;
  // Fixed at 32: every segment whole does not fit, offload does (1320);
  // no micro-batch has both fitting.
  req.fixed_micro = 32;
  const MemoryPlan q = plan_memory(req, curve(1500, 4, &calls));
  EXPECT_TRUE(q.offload);
  EXPECT_FALSE(q.offload_saving.has_value());
}

// A budget between none's peak and the selective tier's: auto takes
// selective, probing none first; below selective's, a whole segment.
TEST(Planner, AutoTakesSelectiveBetweenNoneAndIt) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 8;
  req.fixed_micro = 8;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  // none 1800, selective 1720, 1 whole 1640.
  const MemoryPlan p = plan_memory(req, curve(1750, 4, &calls));
  EXPECT_TRUE(p.fits);
  EXPECT_TRUE(p.selective);
  EXPECT_EQ(p.checkpointed_segments, 4);
  EXPECT_EQ(p.predicted_peak, 1720);
  ASSERT_EQ(p.probes.size(), 2u);
  EXPECT_EQ(p.probes[0].tier.segments, 0);
  EXPECT_FALSE(p.probes[0].fits);
  const MemoryPlan q = plan_memory(req, curve(1700, 4, &calls));
  EXPECT_FALSE(q.selective);
  EXPECT_EQ(q.checkpointed_segments, 1);
  EXPECT_EQ(q.tier_index, 2);
}

// Note [Planning]: the largest micro-batch with a deeper tier is kept only
// when it is faster per sample than a cheaper tier at its own largest
// micro-batch.
TEST(Planner, LargerMicroWithDeeperTierOnlyWhenFasterPerSample) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 32;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  // 1800: none fits up to 8 (1800), selective up to 8 (1720), 4 whole
  // segments 32 (1640); at 32 nothing shallower fits.
  // Cheap checkpointing: 4 whole at 32 takes 1.3 x 1.125 = 1.46 per
  // sample, none at 8 1.5: the larger micro-batch stays.
  const MemoryPlan cheap = plan_memory(req, timed_curve(1800, 4, 0.3, &calls));
  EXPECT_EQ(cheap.micro_batch, 32);
  EXPECT_EQ(cheap.checkpointed_segments, 4);
  EXPECT_FALSE(cheap.selective);
  // Dear checkpointing: 2 x 1.125 = 2.25 against 1.5: none at 8.
  const MemoryPlan dear = plan_memory(req, timed_curve(1800, 4, 1.0, &calls));
  EXPECT_EQ(dear.micro_batch, 8);
  EXPECT_EQ(dear.checkpointed_segments, 0);
  EXPECT_EQ(dear.tier_index, 0);
  EXPECT_EQ(dear.accumulation_steps, 4);
  EXPECT_NE(dear.note.find("faster per sample"), std::string::npos)
      << dear.note;
}

// Even the deepest tier does not fit one sample: refused, naming the tier
// and its measured peak.
TEST(Planner, RefusalNamesTheDeepestTiersPeak) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 8;
  req.checkpointing = Checkpointing::kAuto;
  req.num_segments = 4;
  try {
    plan_memory(req, curve(1000, 4, &calls));  // 1 sample: 1010
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("4/4 segments whole + offload"), std::string::npos)
        << what;
    EXPECT_NE(what.find("measured peak 1010 B"), std::string::npos) << what;
  }
}

TEST(Planner, NothingFitsIsAnError) {
  int64_t calls = 0;
  PlanRequest req;
  req.rank_share = 8;
  req.checkpointing = Checkpointing::kAll;
  req.num_segments = 2;
  EXPECT_THROW(plan_memory(req, curve(500, 2, &calls)), Error);
}

TEST(LeakDetector, WarnsAfterGrowthInARowAndResets) {
  memory::LeakDetector d(1000.0, 3);
  EXPECT_FALSE(d.observe(0, 10000));
  EXPECT_FALSE(d.observe(1, 12000));
  EXPECT_FALSE(d.observe(2, 14000));
  const auto w = d.observe(3, 16000);
  ASSERT_TRUE(w);
  EXPECT_NE(w->find("3 epochs in a row"), std::string::npos) << *w;
  EXPECT_NE(w->find("+5.9 KiB"), std::string::npos) << *w;
  EXPECT_FALSE(d.observe(4, 16100));  // growth stopped: count resets
  EXPECT_FALSE(d.observe(5, 18000));
}

}  // namespace
}  // namespace memtrain
