#include "memtrain/memory/budget.h"

#include <algorithm>

namespace memtrain {

int64_t Budget::usable() const {
  return std::max<int64_t>(
      0,
      static_cast<int64_t>(static_cast<double>(bytes) * (1.0 - headroom)) -
          outside);
}

Budget budget_of(const BudgetSpec& spec, double headroom) {
  Budget b;
  b.spec = spec.text();
  b.bytes = spec.bytes();
  b.headroom = headroom;
  return b;
}

Budget resolve_budget(const std::string& spec, double headroom) {
  return budget_of(BudgetSpec(spec), headroom);
}

}  // namespace memtrain
