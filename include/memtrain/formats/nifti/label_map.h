#pragma once
// Label values to classes (convert-nifti's and predict's --label-map):
// "RULE:CLASS,...", RULE = V, A-B or >V. Read by the NIfTI reader
// (nifti::read_labels), so it lives with the format, not with a converter. No
// LibTorch here.

#include <string>
#include <vector>

namespace memtrain {

// A parsed --label-map rule. Exposed for tests.
struct LabelRule {
  enum Kind { kValue, kRange, kGreater } kind = kValue;
  double a = 0;  // kValue: the value; kRange: low end; kGreater: threshold
  double b = 0;  // kRange: high end (inclusive)
  int cls = 0;   // 0..255
  bool matches(double v) const;
};

// Parses "RULE:CLASS,RULE:CLASS,...". Throws memtrain::Error naming
// --label-map and the bad rule.
std::vector<LabelRule> parse_label_map(const std::string& text);

}  // namespace memtrain
