#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "memtrain/data/inspect.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {
namespace {
std::string path;
}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "Show an HDF5 file's layout (datasets, shapes, dtypes, chunks, "
      "attributes, label counts) and whether memtrain can train on it. Exit "
      "status 0 when it can, 2 when it cannot.");
  cmd->add_option("file", path, "HDF5 file")->required();
}

int run_inspect() {
  const InspectReport report = inspect_file(path);
  std::fputs(report.text.c_str(), stdout);
  return report.ok ? kExitOk : kExitUsage;
}

}  // namespace memtrain::cli
