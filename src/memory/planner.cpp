#include "memtrain/memory/planner.h"

#include <map>
#include <sstream>

#include "memtrain/data/window_shape.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Planning]
// data.batch_size=auto: with the most checkpointing the mode allows (none
// for off, every segment for all and auto), find the largest micro-batch m
// <= the rank's share of the window that fits: double from 1 until a probe
// fails or the share is reached, then bisect. Prefer the largest divisor of
// the share that is at least m/2, so that micro x steps x ranks equals the
// effective batch exactly; otherwise keep m and let the last micro-batch be
// smaller (it is weighted by its samples). Then, for checkpointing auto, find
// the fewest segments (0, 1, ...) with which m still fits.
// Fixed data.batch_size: checkpointing auto takes the fewest segments with
// which that micro-batch fits; off and all probe once, for the prediction.

namespace {

class Prober {
 public:
  Prober(const ProbeFn& fn, MemoryPlan& plan) : fn_(fn), plan_(plan) {}
  ProbeResult operator()(int64_t micro, int64_t segments) {
    const auto key = std::make_pair(micro, segments);
    auto it = cache_.find(key);
    if (it != cache_.end())
      return it->second;
    const ProbeResult r = fn_(micro, segments);
    plan_.probes.push_back({micro, segments, r.fits, r.peak});
    cache_.emplace(key, r);
    return r;
  }

 private:
  const ProbeFn& fn_;
  MemoryPlan& plan_;
  std::map<std::pair<int64_t, int64_t>, ProbeResult> cache_;
};

int64_t fewest_segments(Prober& probe, int64_t micro, int64_t max_segments) {
  for (int64_t s = 0; s <= max_segments; ++s) {
    if (probe(micro, s).fits)
      return s;
  }
  return -1;
}

}  // namespace

MemoryPlan plan_memory(const PlanRequest& req, const ProbeFn& fn) {
  MT_INTERNAL_ASSERT(req.rank_share >= 1 && req.num_segments >= 0);
  MemoryPlan plan;
  Prober probe(fn, plan);
  const int64_t most =
      req.checkpointing == Checkpointing::kOff ? 0 : req.num_segments;
  std::ostringstream note;

  if (req.fixed_micro > 0) {
    plan.micro_batch = req.fixed_micro;
    if (req.checkpointing == Checkpointing::kAuto) {
      const int64_t s = fewest_segments(probe, plan.micro_batch, most);
      plan.fits = s >= 0;
      plan.checkpointed_segments = s >= 0 ? s : most;
      note << "fixed micro-batch " << plan.micro_batch << "; checkpointing "
           << (s >= 0 ? "the fewest segments that fit"
                      : "every segment, and it still does not fit");
    } else {
      plan.checkpointed_segments = most;
      plan.fits = probe(plan.micro_batch, most).fits;
      note << "fixed micro-batch " << plan.micro_batch
           << (plan.fits ? "" : ", which does not fit the budget");
    }
  } else {
    // 1. Largest micro-batch with the most checkpointing allowed.
    int64_t good = 0, bad = 0;
    for (int64_t m = 1;; m *= 2) {
      const int64_t t = std::min(m, req.rank_share);
      if (probe(t, most).fits) {
        good = t;
        if (t == req.rank_share)
          break;
      } else {
        bad = t;
        break;
      }
    }
    MT_CHECK(
        good > 0,
        "memory: even a micro-batch of 1 sample does not fit "
        "the budget (",
        most,
        " of ",
        req.num_segments,
        " segments checkpointed); raise memory.budget, lower "
        "memory.headroom, use training.amp=bf16 or "
        "training.gradient_checkpointing=all, or a smaller model");
    while (bad > 0 && bad - good > 1) {
      const int64_t mid = good + (bad - good) / 2;
      (probe(mid, most).fits ? good : bad) = mid;
    }
    // 2. Prefer a divisor of the share (exact micro x steps x ranks).
    int64_t divisor = good;
    while (req.rank_share % divisor != 0)
      --divisor;
    plan.micro_batch = 2 * divisor >= good ? divisor : good;
    note << "largest micro-batch that fits: " << good;
    if (plan.micro_batch != good) {
      note << ", using " << plan.micro_batch << " (divides the rank share "
           << req.rank_share << ")";
    }
    // 3. Fewest segments for that micro-batch.
    plan.checkpointed_segments =
        req.checkpointing == Checkpointing::kAuto
            ? fewest_segments(probe, plan.micro_batch, most)
            : most;
    MT_INTERNAL_ASSERT(plan.checkpointed_segments >= 0);
  }
  const ProbeResult chosen =
      probe(plan.micro_batch, plan.checkpointed_segments);
  plan.predicted_peak = chosen.peak;
  plan.accumulation_steps = steps_for_share(req.rank_share, plan.micro_batch);
  plan.note = note.str();
  return plan;
}

}  // namespace memtrain
