#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "memtrain/data/h5/inspect.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {
namespace {
std::string path;
bool verify = false;
}  // namespace

void add_inspect(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "inspect",
      "Show an HDF5 file's layout (datasets, shapes, dtypes, chunks, "
      "attributes, label counts) and whether memtrain can train on it. Exit "
      "status 0 when it can, 2 when it cannot.");
  cmd->add_option("file", path, "HDF5 file")->required();
  cmd->add_flag(
      "--verify",
      verify,
      "Read every chunk of every dataset and check its Fletcher32 checksum; "
      "list the damaged chunks (dataset, chunk, the rows or voxels it "
      "holds). Exit status 0 when all are verified, 2 when any is damaged, 1 "
      "when some datasets have no checksum (cannot be verified).");
}

int run_inspect() {
  if (verify) {
    const VerifyReport report = verify_file(path);
    std::fputs(report.text.c_str(), stdout);
    return report.exit_status();
  }
  const InspectReport report = inspect_file(path);
  std::fputs(report.text.c_str(), stdout);
  return report.ok ? kExitOk : kExitUsage;
}

}  // namespace memtrain::cli
