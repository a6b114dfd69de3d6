#include "memtrain/formats/nifti/label_map.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "memtrain/util/error.h"

namespace memtrain {
namespace {

bool parse_number(const std::string& s, double* out) {
  if (s.empty())
    return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(v))
    return false;
  *out = v;
  return true;
}

}  // namespace

bool LabelRule::matches(double v) const {
  switch (kind) {
    case kValue:
      return std::fabs(v - a) <= 1e-6 * std::max(1.0, std::fabs(a));
    case kRange:
      return v >= a - 1e-6 * std::max(1.0, std::fabs(a)) &&
             v <= b + 1e-6 * std::max(1.0, std::fabs(b));
    case kGreater:
      return v > a;
  }
  return false;
}

std::vector<LabelRule> parse_label_map(const std::string& text) {
  std::vector<LabelRule> rules;
  const std::string syntax =
      " (expected a comma list of RULE:CLASS, RULE = V, A-B or >V, CLASS = "
      "0..255, e.g. '>0:1' or '1-28:1,29-42:2')";
  for (const std::string& item : split_list(text)) {
    auto bad = [&](const std::string& why) {
      return Error(
          "convert-nifti: --label-map '" + text + "': rule '" + item + "' " +
          why + syntax);
    };
    const size_t colon = item.rfind(':');
    if (colon == std::string::npos)
      throw bad("has no ':CLASS'");
    const std::string lhs = trim(item.substr(0, colon));
    const std::string rhs = trim(item.substr(colon + 1));
    double cls = 0;
    if (!parse_number(rhs, &cls) || cls != std::floor(cls) || cls < 0 ||
        cls > 255)
      throw bad("has class '" + rhs + "', not an integer in 0..255");
    LabelRule r;
    r.cls = static_cast<int>(cls);
    if (!lhs.empty() && lhs[0] == '>') {
      r.kind = LabelRule::kGreater;
      if (!parse_number(trim(lhs.substr(1)), &r.a))
        throw bad("has no number after '>'");
    } else if (parse_number(lhs, &r.a)) {
      r.kind = LabelRule::kValue;
    } else {
      // A-B: the '-' after the first number (either may be negative).
      r.kind = LabelRule::kRange;
      bool ok = false;
      for (size_t dash = 1; dash < lhs.size() && !ok; ++dash) {
        if (lhs[dash] != '-')
          continue;
        ok = parse_number(trim(lhs.substr(0, dash)), &r.a) &&
             parse_number(trim(lhs.substr(dash + 1)), &r.b);
      }
      if (!ok)
        throw bad("is not V, A-B or >V");
      if (r.a > r.b)
        throw bad("has an empty range (A > B)");
    }
    rules.push_back(r);
  }
  MT_CHECK(!rules.empty(), "convert-nifti: --label-map is empty", syntax);
  return rules;
}

}  // namespace memtrain
