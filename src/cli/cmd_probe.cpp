#include <CLI/CLI.hpp>

#include <cstdio>

#include "commands.h"
#include "memtrain/device/placement.h"
#include "memtrain/util/error.h"

namespace memtrain::cli {

void add_probe(CLI::App& app) {
  app.add_subcommand(
      "probe",
      "Print what this build and machine offer, one 'key value' line each: "
      "torch, cuda_build, cuda_driver, nccl, devices N and 'device I: NAME, "
      "BYTES' per visible GPU. Starts no MPI and no CUDA context; exit "
      "status 0. tests/gpu/probe.sh reads it.");
}

int run_probe() {
  std::fputs(probe_devices().c_str(), stdout);
  return kExitOk;
}

}  // namespace memtrain::cli
