#include "memtrain/memory/planner.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Planning]
// The tiers of checkpointing, cheapest in time first (tier_ladder): none;
// every segment selective (Note [Selective recompute]: its convolutions'
// outputs kept, the rest recomputed, about the time of none); then 1, 2,
// ..., all segments whole, largest activations first (what auto probed
// before selective existed); last, all segments whole with their inputs
// in the host pool (Note [Host offload]: the least device memory, for a
// copy out and back of every segment's inputs). off, all, selective and
// offload have one tier each; auto has them all.
// data.batch_size=auto: with the deepest tier the mode allows, find the
// largest micro-batch m <= the rank's share of the window that fits:
// double from 1 until a probe fails or the share is reached, then bisect
// (for auto, every segment whole first, and offload, which the host
// budget limits too, only where that leaves m below the share).
// Prefer the largest divisor of the share that is at least m/2, so that
// micro x steps x ranks equals the effective batch exactly; otherwise keep
// m and let the last micro-batch be smaller (it is weighted by its
// samples). Then take the first tier with which m fits, and with it every
// smaller micro-batch a window at m runs (the tail of a share, the
// epoch's short last window, sync_bn's near-equal split: req's
// window_micro_batches). Smaller is not always cheaper: on the CPU,
// LibTorch 1.13 runs a 3x3x3 convolution of one sample through im2col
// (N x C_in x 27 x the output's voxels, 4 bytes each; oneDNN from 2
// samples), so a U-Net's last window of 1 sample peaked at 71.3 MiB
// against 45.6 MiB for its micro-batch of 2. When no tier fits them all,
// a smaller m. For auto, also
// search the largest micro-batch of the cheaper tiers (none, selective,
// and every segment whole when m needed offload) and take one when its
// measured time per sample (the probe's second step) is lower: a larger
// micro-batch with a deeper tier only when it is faster.
// Fixed data.batch_size: the first tier with which that micro-batch (and
// the smaller ones of its windows) fits
// (off, all, selective and offload probe their one tier, for the
// prediction).
// With cuDNN's benchmark on (CUDA), a probe's peak is its second step's:
// the first step's algorithm search tries workspaces sized from the free
// memory, which no later step of that shape allocates (planning.cpp).

std::vector<Tier> tier_ladder(Checkpointing mode, int64_t num_segments) {
  const int64_t n = num_segments;
  switch (mode) {
    case Checkpointing::kOff:
      return {Tier{0, false}};
    case Checkpointing::kAll:
      return {Tier{n, false}};
    case Checkpointing::kSelective:
      return {Tier{n, n > 0, false}};
    case Checkpointing::kOffload:
      return {Tier{n, false, n > 0}};
    case Checkpointing::kAuto:
      break;
  }
  std::vector<Tier> ladder = {Tier{0, false, false}};
  if (n > 0)
    ladder.push_back(Tier{n, true, false});
  for (int64_t s = 1; s <= n; ++s)
    ladder.push_back(Tier{s, false, false});
  if (n > 0)
    ladder.push_back(Tier{n, false, true});
  return ladder;
}

bool ladder_offloads(Checkpointing mode, int64_t num_segments) {
  const std::vector<Tier> ladder = tier_ladder(mode, num_segments);
  return std::any_of(
      ladder.begin(), ladder.end(), [](const Tier& t) { return t.offload; });
}

std::string describe(const Tier& tier, int64_t num_segments) {
  std::ostringstream out;
  out << tier.segments << "/" << num_segments << " segments";
  if (tier.segments > 0)
    out << (tier.selective ? " selective" : " whole");
  if (tier.offload)
    out << " + offload";
  return out.str();
}

namespace {

class Prober {
 public:
  Prober(const ProbeFn& fn, MemoryPlan& plan) : fn_(fn), plan_(plan) {}
  ProbeResult operator()(int64_t micro, const Tier& tier) {
    const auto key = std::make_pair(micro, tier);
    auto it = cache_.find(key);
    if (it != cache_.end())
      return it->second;
    const ProbeResult r = fn_(micro, tier);
    plan_.probes.push_back(
        {micro, tier, r.fits, r.peak, r.seconds_per_sample, r.host_bytes});
    cache_.emplace(key, r);
    return r;
  }

 private:
  const ProbeFn& fn_;
  MemoryPlan& plan_;
  std::map<std::pair<int64_t, Tier>, ProbeResult> cache_;
};

// The micro-batch sizes a window runs at micro-batch `micro`: `micro`
// first, then the smaller ones of the request (tails, short windows).
std::vector<int64_t> window_sizes(const PlanRequest& req, int64_t micro) {
  std::vector<int64_t> sizes = {micro};
  if (req.window_micro_batches) {
    for (const int64_t k : req.window_micro_batches(micro)) {
      MT_INTERNAL_ASSERT(k >= 1 && k <= micro);
      if (k != micro)
        sizes.push_back(k);
    }
  }
  return sizes;
}

// Whether every micro-batch a window runs at `micro` fits with `tier`;
// the window's peak, the largest of theirs, in `peak`.
bool window_fits(
    Prober& probe,
    const PlanRequest& req,
    int64_t micro,
    const Tier& tier,
    int64_t* peak = nullptr) {
  int64_t most = 0;
  for (const int64_t k : window_sizes(req, micro)) {
    const ProbeResult r = probe(k, tier);
    if (!r.fits)
      return false;
    most = std::max(most, r.peak);
  }
  if (peak)
    *peak = most;
  return true;
}

// The first tier of `ladder` with which every micro-batch of a window at
// `micro` fits; -1: none.
int64_t first_fitting(
    Prober& probe,
    const PlanRequest& req,
    int64_t micro,
    const std::vector<Tier>& ladder) {
  for (size_t i = 0; i < ladder.size(); ++i) {
    if (window_fits(probe, req, micro, ladder[i]))
      return static_cast<int64_t>(i);
  }
  return -1;
}

// The largest micro-batch <= `most` that fits with `tier`: double from 1
// until a probe fails or `most` is reached, then bisect; 0: not even 1.
int64_t largest_fitting(Prober& probe, const Tier& tier, int64_t most) {
  if (most <= 0)
    return 0;
  int64_t good = 0, bad = 0;
  for (int64_t m = 1;; m *= 2) {
    const int64_t t = std::min(m, most);
    if (probe(t, tier).fits) {
      good = t;
      if (t == most)
        break;
    } else {
      bad = t;
      break;
    }
  }
  while (bad > 0 && bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (probe(mid, tier).fits ? good : bad) = mid;
  }
  return good;
}

// `good`, or the largest divisor of the rank share that is at least
// good/2 (exact micro x steps x ranks); 0 stays 0.
int64_t exact_micro(int64_t good, int64_t share) {
  if (good <= 0)
    return 0;
  int64_t divisor = good;
  while (share % divisor != 0)
    --divisor;
  return 2 * divisor >= good ? divisor : good;
}

// Note [Offload that saves nothing]
// Offload lowers the peak only where the peak is in the forward, while the
// checkpointed segments' inputs are held; a model whose peak is elsewhere
// (SE-ResNeXt50 at small images: its weights, gradients and the backward
// of its widest stage) gets about the same peak for the copies' time
// (bench_memory, fp32, one thread, LibTorch 1.13 and 2.11 alike: 851,968 B
// less of 325,270,016 at 2 x 32 x 32, 12,465,664 B less of 346,629,632 at
// 8 x 64 x 64; host_offload_test: equal under bf16 at 2 x 32 x 32 on
// 2.11). Where a search probed every segment whole and
// offload at the same micro-batch and both fit, the plan records the
// difference, and says so when offload saved nothing: that a budget below
// every segment whole's peak is then met by a smaller micro-batch, not by
// offload.
void record_offload_saving(MemoryPlan& plan, std::ostringstream& note) {
  const ProbeRecord* whole = nullptr;
  const ProbeRecord* off = nullptr;
  for (const ProbeRecord& p : plan.probes) {
    if (!p.fits || p.faster_form || p.chunk != 0 || !p.tier.offload)
      continue;
    for (const ProbeRecord& q : plan.probes) {
      if (q.fits && !q.faster_form && q.chunk == 0 && q.micro == p.micro &&
          !q.tier.offload && !q.tier.selective &&
          q.tier.segments == p.tier.segments &&
          (!off || p.micro > off->micro)) {
        whole = &q;
        off = &p;
      }
    }
  }
  if (!off)
    return;
  plan.offload_saving = whole->peak - off->peak;
  plan.offload_saving_micro = off->micro;
  if (*plan.offload_saving <= 0) {
    note << "; offload saves nothing at micro-batch " << off->micro << " (peak "
         << format_bytes(static_cast<double>(off->peak)) << " against "
         << format_bytes(static_cast<double>(whole->peak))
         << " with every segment whole): this model's peak is not where the "
            "segments' inputs are held";
  }
}

// Cheaper tiers weighed against the chosen one by time per sample (each
// costs a search of its own micro-batch): none and every segment
// selective (and every segment whole when the chosen tier offloads).
constexpr int64_t kCheaperTiersTried = 2;

}  // namespace

int64_t largest_chunk(int64_t units, const std::function<bool(int64_t)>& fits) {
  int64_t good = 1, bad = 0;  // bad 0: nothing failed yet
  while (good < units) {
    const int64_t next = std::min(2 * good, units);
    if (!fits(next)) {
      bad = next;
      break;
    }
    good = next;
  }
  while (bad > 0 && bad - good > 1) {
    const int64_t mid = good + (bad - good) / 2;
    (fits(mid) ? good : bad) = mid;
  }
  return good;
}

MemoryPlan plan_memory(const PlanRequest& req, const ProbeFn& fn) {
  MT_INTERNAL_ASSERT(req.rank_share >= 1 && req.num_segments >= 0);
  MemoryPlan plan;
  Prober probe(fn, plan);
  const std::vector<Tier> ladder =
      tier_ladder(req.checkpointing, req.num_segments);
  const int64_t deepest = static_cast<int64_t>(ladder.size()) - 1;
  const auto name = [&](int64_t i) {
    return describe(ladder[static_cast<size_t>(i)], req.num_segments);
  };
  std::ostringstream note;

  int64_t chosen = deepest;
  if (req.fixed_micro > 0) {
    plan.micro_batch = req.fixed_micro;
    const int64_t i = first_fitting(probe, req, plan.micro_batch, ladder);
    plan.fits = i >= 0;
    chosen = i >= 0 ? i : deepest;
    plan.memory_micro_batch = plan.micro_batch;
    plan.memory_tier_index = chosen;
    note << "fixed micro-batch " << plan.micro_batch;
    if (req.checkpointing == Checkpointing::kAuto) {
      note << "; checkpointing "
           << (i >= 0 ? "the cheapest tier that fits: " + name(i)
                      : "the deepest tier, " + name(deepest) +
                            ", and it still does not fit");
    } else if (!plan.fits) {
      note << ", which does not fit the budget";
    }
  } else {
    // 1. Largest micro-batch with the deepest tier allowed: the deepest
    // on the device alone first; offload (limited by memory.host_budget
    // too) only where that leaves the micro-batch below the share.
    const bool offloads = ladder.back().offload && ladder.size() > 1;
    const Tier& device_deepest = ladder[ladder.size() - (offloads ? 2 : 1)];
    int64_t good = largest_fitting(probe, device_deepest, req.rank_share);
    if (offloads && good < req.rank_share)
      good =
          std::max(good, largest_fitting(probe, ladder.back(), req.rank_share));
    const ProbeResult one = probe(1, ladder.back());  // cached
    MT_CHECK(
        good > 0,
        "memory: even a micro-batch of 1 sample does not fit the budget "
        "with checkpointing ",
        name(deepest),
        " (",
        one.host_exceeded
            ? "its offloaded activations passed memory.host_budget after "
        : one.out_of_memory ? "it ran out of memory after "
                            : "measured peak ",
        format_bytes(
            static_cast<double>(one.host_exceeded ? one.host_bytes : one.peak)),
        "); raise memory.budget",
        one.host_exceeded ? " or memory.host_budget" : "",
        ", lower memory.headroom, use training.amp=bf16 or "
        "training.gradient_checkpointing=auto (down to offload), or a "
        "smaller model");
    // 2. Prefer a divisor of the share (exact micro x steps x ranks).
    plan.micro_batch = exact_micro(good, req.rank_share);
    note << "largest micro-batch that fits: " << good;
    if (plan.micro_batch != good) {
      note << ", using " << plan.micro_batch << " (divides the rank share "
           << req.rank_share << ")";
    }
    // 3. The cheapest tier with which every micro-batch of a window at
    // that size fits (its tail and the epoch's short last window too: on
    // the CPU a smaller one can need more); where none does, a smaller
    // micro-batch (1 fits: step 1 probed it at the deepest tier).
    chosen = first_fitting(probe, req, plan.micro_batch, ladder);
    while (chosen < 0 && plan.micro_batch > 1) {
      note << "; a smaller micro-batch of a window at " << plan.micro_batch
           << " does not fit";
      plan.micro_batch = exact_micro(plan.micro_batch - 1, req.rank_share);
      chosen = first_fitting(probe, req, plan.micro_batch, ladder);
      note << ", using " << plan.micro_batch;
    }
    MT_INTERNAL_ASSERT(chosen >= 0);
    plan.memory_micro_batch = plan.micro_batch;
    plan.memory_tier_index = chosen;
    // 4. A cheaper tier at its own largest micro-batch, when that is
    // faster per sample than the larger micro-batch with the deeper tier:
    // the fastest of them.
    if (req.checkpointing == Checkpointing::kAuto) {
      const int64_t deep = chosen, deep_micro = plan.micro_batch;
      const double deep_s = probe(deep_micro, ladder[static_cast<size_t>(deep)])
                                .seconds_per_sample;
      double best = deep_s;
      // none and selective; and, when offload was needed, every segment
      // whole at its own micro-batch.
      std::vector<int64_t> cheaper;
      for (int64_t i = 0; i < deep && i < kCheaperTiersTried; ++i)
        cheaper.push_back(i);
      if (ladder[static_cast<size_t>(deep)].offload &&
          deep - 1 >= kCheaperTiersTried)
        cheaper.push_back(deep - 1);
      for (const int64_t i : cheaper) {
        const Tier& t = ladder[static_cast<size_t>(i)];
        const int64_t m = exact_micro(
            largest_fitting(probe, t, deep_micro - 1), req.rank_share);
        if (m == 0)
          continue;
        const ProbeResult r = probe(m, t);
        if (r.fits && r.seconds_per_sample < best &&
            window_fits(probe, req, m, t)) {
          best = r.seconds_per_sample;
          plan.micro_batch = m;
          chosen = i;
        }
      }
      if (chosen != deep) {
        note << "; " << name(chosen) << " at micro-batch " << plan.micro_batch
             << " is faster per sample than " << name(deep) << " at "
             << deep_micro << " (" << best * 1e3 << " vs " << deep_s * 1e3
             << " ms)";
      }
      note << "; checkpointing the cheapest tier that fits: " << name(chosen);
    }
  }
  plan.tier_index = chosen;
  const Tier& tier = ladder[static_cast<size_t>(chosen)];
  plan.checkpointed_segments = tier.segments;
  plan.selective = tier.selective;
  plan.offload = tier.offload;
  const ProbeResult chosen_probe = probe(plan.micro_batch, tier);  // cached
  plan.predicted_peak = chosen_probe.peak;
  // Every micro-batch a window runs (cached): the window's peak.
  window_fits(probe, req, plan.micro_batch, tier, &plan.predicted_peak);
  plan.window_micro_batches = window_sizes(req, plan.micro_batch);
  plan.predicted_host_bytes = chosen_probe.host_bytes;
  plan.accumulation_steps = steps_for_share(req.rank_share, plan.micro_batch);
  record_offload_saving(plan, note);
  plan.note = note.str();
  return plan;
}

}  // namespace memtrain
