#pragma once
// Budget: how much device memory one rank may use. A named profile (the
// capacity a card reports) or a size (config/memory_size.h: BudgetSpec),
// minus a headroom kept free.

#include <cstdint>
#include <string>

#include "memtrain/config/memory_size.h"

namespace memtrain {

struct Budget {
  std::string spec;       // as configured: "v100-16gb", "512MiB", "" (none)
  int64_t bytes = 0;      // 0: unlimited
  double headroom = 0.0;  // fraction of `bytes` kept free by the planner
  // CUDA: what the process holds outside the caching allocator (context,
  // libraries, NCCL), measured at set-up (memory::measure_outside()).
  int64_t outside = 0;

  bool limited() const {
    return bytes > 0;
  }
  // What the planner may fill: bytes * (1 - headroom) - outside.
  int64_t usable() const;
  // The allocator's cap: bytes - outside (0: none).
  int64_t allocator_cap() const {
    return limited() ? bytes - outside : 0;
  }
};

// The run's budget: `spec` with `headroom` (nothing parsed).
Budget budget_of(const BudgetSpec& spec, double headroom);

// budget_of(BudgetSpec(spec), headroom).
Budget resolve_budget(const std::string& spec, double headroom);

}  // namespace memtrain
