#pragma once
// What validation writes of a DiceTable (Note [One Dice]): the per-case
// figures of the validation record and the epoch's summary.json in
// nnU-Net's shape. No LibTorch here.

#include <nlohmann/json_fwd.hpp>

#include <string>

namespace memtrain {

class DiceTable;

// The record's per-case figures: "val_cases", one entry per case in the
// table's order, {"case": name, "dice": {"<class>": Dice, ...}, "mean":
// the case's mean}, the classes those that count (DiceTable::first_class
// on); a NaN (a class the case's labels lack) is written null.
nlohmann::json dice_cases(const DiceTable& t);

// val_dice_per_class: class c's mean over the cases (every class 0..K-1,
// null where no case counts it).
nlohmann::json dice_per_class(const DiceTable& t);

// nnU-Net's summary.json shape: "metric_per_case" (per case {"case",
// "metrics": {"<class>": {"Dice", "TP", "FP", "FN", "n_pred", "n_ref"}}}),
// "mean" ({"<class>": {"Dice": class mean}}), "foreground_mean" ({"Dice":
// the mean of the class means of classes >= 1}), and memtrain's own
// "case_mean" ({"Dice": DiceTable::mean(), val_dice}) and "rule"
// (include_background, ignore_empty). The classes listed are those that
// count.
nlohmann::json dice_summary(const DiceTable& t);

// Writes dice_summary(t) to DIR/summary.json, atomically (DIR is made).
void write_dice_summary(const std::string& dir, const DiceTable& t);

}  // namespace memtrain
