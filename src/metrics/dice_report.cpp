#include "memtrain/metrics/dice_report.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

#include "memtrain/metrics/seg_metrics.h"
#include "memtrain/util/atomic_file.h"

namespace memtrain {
namespace {

// nlohmann::json writes a NaN as null; spelled out here so the intent is.
nlohmann::json value(double d) {
  return std::isnan(d) ? nlohmann::json(nullptr) : nlohmann::json(d);
}

}  // namespace

nlohmann::json dice_cases(const DiceTable& t) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < t.num_cases(); ++i) {
    nlohmann::json dice = nlohmann::json::object();
    for (int64_t c = t.first_class(); c < t.num_classes(); ++c)
      dice[std::to_string(c)] = value(t.dice(i, c));
    out.push_back(
        {{"case", t.name(i)}, {"dice", dice}, {"mean", value(t.case_mean(i))}});
  }
  return out;
}

nlohmann::json dice_per_class(const DiceTable& t) {
  nlohmann::json out = nlohmann::json::array();
  for (int64_t c = 0; c < t.num_classes(); ++c)
    out.push_back(value(t.class_mean(c)));
  return out;
}

nlohmann::json dice_summary(const DiceTable& t) {
  nlohmann::json per_case = nlohmann::json::array();
  for (size_t i = 0; i < t.num_cases(); ++i) {
    nlohmann::json metrics = nlohmann::json::object();
    for (int64_t c = t.first_class(); c < t.num_classes(); ++c) {
      const DiceCounts& n = t.counts(i, c);
      metrics[std::to_string(c)] = {
          {"Dice", value(t.dice(i, c))},
          {"TP", n.both},
          {"FP", n.pred - n.both},
          {"FN", n.truth - n.both},
          {"n_pred", n.pred},
          {"n_ref", n.truth}};
    }
    per_case.push_back({{"case", t.name(i)}, {"metrics", metrics}});
  }
  nlohmann::json mean = nlohmann::json::object();
  double fg_sum = 0.0;
  int64_t fg_n = 0;
  for (int64_t c = t.first_class(); c < t.num_classes(); ++c) {
    const double d = t.class_mean(c);
    mean[std::to_string(c)] = {{"Dice", value(d)}};
    if (c >= 1 && !std::isnan(d)) {
      fg_sum += d;
      ++fg_n;
    }
  }
  const double fg = fg_n > 0 ? fg_sum / static_cast<double>(fg_n)
                             : std::numeric_limits<double>::quiet_NaN();
  return {
      {"metric_per_case", per_case},
      {"mean", mean},
      {"foreground_mean", {{"Dice", value(fg)}}},
      {"case_mean", {{"Dice", value(t.mean())}}},
      {"rule",
       {{"include_background", t.first_class() == 0},
        {"ignore_empty", t.ignore_empty()}}}};
}

void write_dice_summary(const std::string& dir, const DiceTable& t) {
  make_directories(dir);
  write_file_atomically(dir + "/summary.json", dice_summary(t).dump(1) + "\n");
}

}  // namespace memtrain
