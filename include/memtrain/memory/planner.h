#pragma once
// Planner: the largest micro-batch, and the fewest checkpointed segments,
// that fit the budget. It measures instead of modelling: a probe runs one
// forward + backward + optimizer step at a micro-batch size with some
// segments checkpointed, inside the device scope, and reports whether it fit
// and its peak (two steps, so that the optimizer state exists during the
// second, as in every window after the first). The search is independent of how
// probes run (tests use a synthetic memory curve).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"

namespace memtrain {

struct ProbeResult {
  bool fits = false;  // no out-of-memory and peak <= the usable budget
  int64_t peak = 0;   // peak device bytes of the probe (0 if it ran out)
};

// probe(micro, checkpointed_segments)
using ProbeFn = std::function<ProbeResult(int64_t, int64_t)>;

struct PlanRequest {
  int64_t rank_share = 1;   // samples per rank per window: ceil(E / world)
  int64_t fixed_micro = 0;  // 0: auto (search); else this micro-batch
  Checkpointing checkpointing = Checkpointing::kOff;  // off | all | auto
  int64_t num_segments = 0;
};

struct ProbeRecord {
  int64_t micro;
  int64_t segments;
  bool fits;
  int64_t peak;
};

struct MemoryPlan {
  int64_t micro_batch = 0;
  int64_t accumulation_steps = 0;  // ceil(rank_share / micro_batch)
  int64_t checkpointed_segments = 0;
  int64_t predicted_peak = 0;  // the chosen probe's peak
  bool fits = true;  // false: nothing fit; the OOM guard will have to act
  std::vector<ProbeRecord> probes;
  std::string note;  // how the choice was made, for the banner
};

// Chooses as described in Note [Planning] (planner.cpp). Throws
// memtrain::Error when an automatic micro-batch cannot fit even at 1 sample.
MemoryPlan plan_memory(const PlanRequest& request, const ProbeFn& probe);

}  // namespace memtrain
