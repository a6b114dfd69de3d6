#pragma once
// The table of keys (private to src/config/): one Key per row of
// config/keys.def, and what reads, checks and writes a key's value.

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"

namespace YAML {
class Node;
}

namespace memtrain {

constexpr double kInf = std::numeric_limits<double>::infinity();

// A row's check: the range of a number (or of each number of a list), and
// whether `auto` (integers) or "" (strings) is a value.
struct Check {
  double min = -kInf;
  double max = kInf;
  bool min_open = false;
  bool max_open = false;
  bool or_auto = false;
  bool may_be_empty = false;
  int64_t auto_is = kAuto;  // or_auto: the value that stands for `auto`
};
// [lo, hi]
constexpr Check In(double lo, double hi) {
  return {lo, hi, false, false, false, false, kAuto};
}
// (lo, hi]
constexpr Check Above(double lo, double hi) {
  return {lo, hi, true, false, false, false, kAuto};
}
// [lo, hi)
constexpr Check Below(double lo, double hi) {
  return {lo, hi, false, true, false, false, kAuto};
}
// `auto` (kAuto, or `as` where kAuto is a value of [lo, hi]) or [lo, hi]
constexpr Check AutoOr(double lo, double hi, int64_t as = kAuto) {
  return {lo, hi, false, false, true, false, as};
}
// A string that may be "" (none, skip, the defaults); other string keys
// refuse "" (`--memory.budget=` is a typo, not "none").
constexpr Check MayBeEmpty() {
  return {-kInf, kInf, false, false, false, true, kAuto};
}
constexpr Check Any() {
  return {};
}

struct Key {
  enum class Type {
    kInt,
    kFloat,
    kBool,
    kString,
    kChoice,
    kInt3,
    kClasses,
    kStrings,
    kFloat2,
    kBudget
  };
  std::string name;  // "section.field"
  Type type = Type::kString;
  std::string help;
  Check check;
  std::vector<std::string> choices;  // kChoice: the spellings
  // Accessors into a config (exactly one is set, by type).
  std::function<int64_t*(TrainConfig&)> i;
  std::function<double*(TrainConfig&)> f;
  std::function<bool*(TrainConfig&)> b;
  std::function<std::string*(TrainConfig&)> s;
  std::function<Int3*(TrainConfig&)> t;
  std::function<ClassChoice*(TrainConfig&)> c;
  std::function<Strings*(TrainConfig&)> l;
  std::function<Range2*(TrainConfig&)> r;
  std::function<BudgetSpec*(TrainConfig&)> m;
  // kChoice: the value's spelling, and parse-and-set (false: not a choice).
  std::function<const char*(TrainConfig&)> get_choice;
  std::function<bool(TrainConfig&, const std::string&)> set_choice;
};

// Every key, in keys.def's order (the order of --help and the YAML).
const std::vector<Key>& keys();

// The key `name`; else throws memtrain::Error with a did-you-mean and the
// section's keys. `origin` says where the name was written.
const Key& find_key(const std::string& name, const std::string& origin);

// What `k` allows, for messages and --help ("an integer in [1, 256]").
std::string allowed(const Key& k);

// `k`'s value in `cfg` as YAML text.
std::string value_text(const Key& k, TrainConfig& cfg);

// Parses `node` as `k`'s value, checks it and sets it in `cfg`; throws
// memtrain::Error naming the key, the text, `origin` and what is allowed.
void assign(
    TrainConfig& cfg,
    const Key& k,
    const YAML::Node& node,
    const std::string& origin);

// "a, b, c" with `sep` between.
std::string join(const std::vector<std::string>& items, const char* sep);

}  // namespace memtrain
