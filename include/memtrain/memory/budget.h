#pragma once
// Budget: how much device memory one rank may use. A named profile (the
// capacity a card reports) or a size, minus a headroom kept free.

#include <cstdint>
#include <string>
#include <vector>

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

// "512MiB", "14GiB", "1.5GiB", "2000000000", "16GB" (GB = 10^9). Throws
// memtrain::Error naming the text and the accepted forms.
int64_t parse_memory_size(const std::string& text);

// memory.budget as configured: its text (a profile name, a size, "none")
// and the bytes it names (0: none), parsed once, where the value is set --
// the config's loader, or code that assigns a string (`cfg.memory.budget =
// "64MiB"`, hence the implicit constructors). Throws memtrain::Error
// listing the profiles.
class BudgetSpec {
 public:
  BudgetSpec() = default;               // none
  BudgetSpec(const std::string& text);  // NOLINT(google-explicit-constructor)
  BudgetSpec(const char* text)          // NOLINT(google-explicit-constructor)
      : BudgetSpec(std::string(text)) {}

  const std::string& text() const {
    return text_;
  }
  int64_t bytes() const {
    return bytes_;
  }
  bool limited() const {
    return bytes_ > 0;
  }

 private:
  std::string text_ = "none";
  int64_t bytes_ = 0;
};

// The run's budget: `spec` with `headroom` (nothing parsed).
Budget budget_of(const BudgetSpec& spec, double headroom);

// budget_of(BudgetSpec(spec), headroom).
Budget resolve_budget(const std::string& spec, double headroom);

// The known profiles as "name (size)" strings, for messages and --help.
std::vector<std::string> budget_profiles();

}  // namespace memtrain
