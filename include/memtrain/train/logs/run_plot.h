#pragma once
// The curves of runs drawn by gnuplot into a PNG: output.dir/progress.png
// (rank 0, at each epoch's end) and `memtrain plot` (several runs) share
// this one drawing. Three panels: loss per window against the step, the
// validation metric (the task's first metric with a direction, named in the
// validation record's val_metrics) against the epoch, and the window's memory
// peak against the step with the budget as a dashed line. No LibTorch.

#include <array>
#include <string>
#include <vector>

namespace memtrain {

constexpr int kPlotWidth = 1000;  // pixels of every PNG drawn here
constexpr int kPlotHeight = 900;

struct RunCurves {
  std::string label;                            // the folder's name
  std::vector<std::array<double, 2>> loss;      // (step, window loss)
  std::vector<std::array<double, 2>> mem_peak;  // (step, MiB)
  std::vector<std::array<double, 2>> val;       // (epoch 1.., metric)
  std::string val_metric;                       // "": no validation
  std::string val_better;                       // higher | lower
  double budget_mib = 0.0;                      // 0: no budget
};

// Reads DIR/metrics.jsonl (and the budget from DIR/memory_plan.json).
// Throws memtrain::Error when the folder has no metrics.jsonl or it holds no
// window record; lines cut short by a crash are skipped.
RunCurves load_run_curves(const std::string& dir);

// The gnuplot script that draws `runs` into `png` (data inline).
std::string plot_script(
    const std::vector<RunCurves>& runs, const std::string& png);

// Draws `runs` into `png` with gnuplot ($MEMTRAIN_GNUPLOT if set, else
// gnuplot on PATH), atomically (a temporary file
// renamed over `png`). Returns "" when drawn, else why not (gnuplot not
// found, its status and first error line).
std::string draw_runs(
    const std::vector<RunCurves>& runs, const std::string& png);

}  // namespace memtrain
