#pragma once
// Planner: the largest micro-batch, and the cheapest checkpointing tier,
// that fit the budget. It measures instead of modelling: a probe runs one
// forward + backward + optimizer step at a micro-batch size with a tier of
// checkpointing, inside the device scope, and reports whether it fit
// and its peak (two steps, so that the optimizer state exists during the
// second, as in every window after the first). The search is independent of how
// probes run (tests use a synthetic memory curve).

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"

namespace memtrain {

struct ProbeResult {
  bool fits = false;  // no out-of-memory and peak <= the usable budget
  int64_t peak = 0;   // peak device bytes of the probe (0 if it ran out)
  // The probe's second step (the one with optimizer state) as the device
  // ran it: its forward and backward over the micro-batch, plus its
  // optimizer step over the rank's share of a window; 0 if it ran out.
  double seconds_per_sample = 0;
  // An allocation passed the cap; `peak` is what it held until then.
  bool out_of_memory = false;
  // Offload tiers: the host pool's peak bytes in the probe (Note [Host
  // offload]); out of memory.host_budget (then `fits` is false).
  int64_t host_bytes = 0;
  bool host_exceeded = false;
};

// A checkpointing tier: the first `segments` segments checkpointed, whole
// or, when `selective`, keeping their convolutions' outputs (Note
// [Selective recompute]); with `offload`, whole, their inputs waiting in
// the host pool (Note [Host offload]).
struct Tier {
  int64_t segments = 0;
  bool selective = false;
  bool offload = false;
  bool operator<(const Tier& o) const {
    if (segments != o.segments)
      return segments < o.segments;
    return selective != o.selective ? selective < o.selective
                                    : offload < o.offload;
  }
};

// The tiers a mode may use, cheapest in time first (Note [Planning]):
// off: none; all: every segment whole; selective: every segment
// selective; offload: every segment whole and offloaded; auto: none, every
// segment selective, 1, 2, ... segments whole, then every segment whole
// and offloaded.
std::vector<Tier> tier_ladder(Checkpointing mode, int64_t num_segments);

// Whether a ladder of `mode` has an offload tier (the run needs a host
// pool).
bool ladder_offloads(Checkpointing mode, int64_t num_segments);

// "0/5 segments", "5/5 segments selective", "2/5 segments whole",
// "5/5 segments whole + offload", for banners and notes.
std::string describe(const Tier& tier, int64_t num_segments);

// probe(micro, tier)
using ProbeFn = std::function<ProbeResult(int64_t, const Tier&)>;

struct PlanRequest {
  int64_t rank_share = 1;   // samples per rank per window: ceil(E / world)
  int64_t fixed_micro = 0;  // 0: auto (search); else this micro-batch
  Checkpointing checkpointing = Checkpointing::kOff;  // off|all|auto|selective
  int64_t num_segments = 0;
  // The micro-batch sizes any rank's window can run at micro-batch m,
  // besides m: the tail of a share (share % m), the epoch's short last
  // window, the near-equal split of model.sync_bn. Each is probed with the
  // chosen tier and must fit too. Empty: m alone.
  using WindowSizes = std::function<std::vector<int64_t>(int64_t)>;
  WindowSizes window_micro_batches;
};

struct ProbeRecord {
  int64_t micro;
  Tier tier;
  bool fits;
  int64_t peak;
  double seconds_per_sample;
  int64_t host_bytes;
  int64_t chunk = 0;  // the extraction chunk probed (0: not a chunk probe)
  bool faster_form = false;  // a probe of the model's faster form
};

struct MemoryPlan {
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 0;  // ceil(rank_share / micro_batch)
  int64_t checkpointed_segments = 0;
  bool selective = false;  // those segments keep their convolutions' outputs
  bool offload = false;    // their inputs wait in the host pool
  int64_t predicted_host_bytes = 0;  // the chosen probe's host pool peak
  int64_t tier_index = 0;            // in tier_ladder(): what ranks agree on
  // The plan by memory alone (before the time-per-sample comparison),
  // which ranks fall back to when their timings chose differently.
  int64_t memory_micro_batch = 0;
  int64_t memory_tier_index = 0;
  // The largest peak of the chosen tier's probes over every micro-batch a
  // window runs (window_micro_batches: the micro-batch first).
  int64_t predicted_peak = 0;
  std::vector<int64_t> window_micro_batches;
  bool fits = true;  // false: nothing fit; the OOM guard will have to act
  // A frozen extraction's units per call the plan chose (Classifier::
  // set_chunk; model.slice_chunk auto under a budget), of chunk_units of
  // the micro-batch; 0: not planned.
  int64_t chunk = 0;
  int64_t chunk_units = 0;
  // A model with a lean and a faster form (Classifier::has_lean_form):
  // "faster" or "lean", the one the plan runs (Note [Planning the faster
  // form] in planning.cpp); empty: the model has one form.
  std::string form;
  // Note [Offload that saves nothing]: every segment whole's peak less
  // offload's, at the largest micro-batch where both were probed and fit
  // (offload_saving_micro); unset where no such pair was probed.
  std::optional<int64_t> offload_saving;
  int64_t offload_saving_micro = 0;
  std::vector<ProbeRecord> probes;
  std::string note;  // how the choice was made, for the banner
};

// The largest n in [1, units] the search of Note [Planning the
// extraction chunk] (train/loop/planning.cpp) finds: doubled from 1 while
// fits(n), then bisected between the last that fit and the first that did
// not; 1 when nothing larger fits (1 itself is not asked).
int64_t largest_chunk(int64_t units, const std::function<bool(int64_t)>& fits);

// Chooses as described in Note [Planning] (planner.cpp). Throws
// memtrain::Error when an automatic micro-batch cannot fit even at 1 sample.
MemoryPlan plan_memory(const PlanRequest& request, const ProbeFn& probe);

}  // namespace memtrain
