#pragma once
// Memory sizes as a config writes them: parse_memory_size ("512MiB",
// "14GiB", "16GB") and memory.budget's BudgetSpec (a card profile, a size,
// or none). memory/budget.h turns a BudgetSpec into the run's Budget.

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

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

// The known profiles as "name (size)" strings, for messages and --help.
std::vector<std::string> budget_profiles();

}  // namespace memtrain
