#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "memtrain/train/logs/run_plot.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {
namespace {
std::vector<std::string> dirs;
std::string out;
}  // namespace

void add_plot(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plot",
      "Compare runs in one PNG (gnuplot): loss per window against the step, "
      "the validation metric against the epoch and the memory peak against "
      "the step, one curve per run labelled by its folder. Exit status 0 "
      "when drawn, 2 for a folder without metrics or no gnuplot.");
  cmd->add_option("run_dir", dirs, "output.dir of memtrain train runs")
      ->required();
  cmd->add_option("--out", out, "the PNG to write")->required();
}

int run_plot() {
  std::vector<RunCurves> runs;
  for (const auto& d : dirs)
    runs.push_back(load_run_curves(d));
  const std::string why = draw_runs(runs, out);
  MT_CHECK(why.empty(), "'", out, "' not drawn: ", why);
  std::printf("plot: %s (%zu runs)\n", out.c_str(), runs.size());
  return kExitOk;
}

}  // namespace memtrain::cli
