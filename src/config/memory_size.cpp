#include "memtrain/config/memory_size.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

struct Profile {
  const char* name;
  int64_t bytes;
};

// The total capacity each card reports to CUDA (what PyTorch's
// out-of-memory message calls "total capacity"), rounded to MiB.
constexpr Profile kProfiles[] = {
    {"v100-16gb", 16160 * kMiB},  // 15.78 GiB
    {"v100-32gb", 32510 * kMiB},  // 31.75 GiB
    {"a100-40gb", 40536 * kMiB},  // 39.59 GiB
    {"a100-80gb", 81050 * kMiB},  // 79.15 GiB
};

}  // namespace

std::vector<std::string> budget_profiles() {
  std::vector<std::string> out;
  for (const auto& p : kProfiles) {
    out.push_back(std::string(p.name) + " (" + format_bytes(p.bytes) + ")");
  }
  return out;
}

int64_t parse_memory_size(const std::string& text) {
  const char* s = text.c_str();
  char* end = nullptr;
  const double value = std::strtod(s, &end);
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit[0]))) {
    unit.erase(0, 1);
  }
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB") {
    scale = 1024.0;
  } else if (unit == "MiB") {
    scale = 1024.0 * 1024;
  } else if (unit == "GiB") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "TiB") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "KB") {
    scale = 1e3;
  } else if (unit == "MB") {
    scale = 1e6;
  } else if (unit == "GB") {
    scale = 1e9;
  }
  MT_CHECK(
      end != s && scale > 0 && std::isfinite(value) && value > 0,
      "memory size '",
      text,
      "' is not a positive size; write e.g. 512MiB, 14GiB, 1.5GiB or "
      "16GB (GB = 10^9 bytes)");
  // 2^63 bytes and more do not fit the int64_t every size is held in (a
  // cast would wrap them negative); under a byte rounds to none.
  const double bytes = std::round(value * scale);
  MT_CHECK(
      bytes >= 1 && bytes < 9223372036854775808.0,
      "memory size '",
      text,
      "' is ",
      bytes < 1 ? "less than one byte" : "2^63 bytes (8 EiB) or more",
      "; write the size of a machine's memory, e.g. 14GiB");
  return static_cast<int64_t>(bytes);
}

BudgetSpec::BudgetSpec(const std::string& text) : text_(text) {
  if (text.empty() || text == "none")
    return;
  for (const auto& p : kProfiles) {
    if (text == p.name) {
      bytes_ = p.bytes;
      return;
    }
  }
  if (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '.') {
    try {
      bytes_ = parse_memory_size(text);
    } catch (const Error& e) {
      throw Error("memory.budget = '" + text + "': " + e.what());
    }
    return;
  }
  std::string names;
  for (const auto& p : budget_profiles())
    names += (names.empty() ? "" : ", ") + p;
  throw Error(
      "memory.budget = '" + text + "': not a profile or a size; profiles: " +
      names + "; or a size such as 512MiB or 14GiB; or none");
}

}  // namespace memtrain
