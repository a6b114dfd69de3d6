#pragma once
// Private to src/cli/: what the commands that start ranks share, and the
// trainer `eval` starts from.

#include <memory>
#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/environment.h"
#include "memtrain/train/loop/trainer.h"

namespace memtrain::cli {

// The launch check (no torchrun-only world) and the threads per rank, on
// every rank; false (the error printed by the lowest failing rank) if any
// rank fails.
bool start_ranks(Environment& env);

// The config's device and communicator and a trainer that writes nothing,
// with `weights` loaded by name (strict). Members are destroyed trainer
// first.
struct WeightsRun {
  std::unique_ptr<Placement> placement;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Trainer> trainer;
};

// Builds `run` step by step, each step agreed by every rank; false (the
// error printed) if any rank fails.
bool start_weights_run(
    Environment& env,
    const TrainConfig& cfg,
    const std::string& weights,
    WeightsRun* run);

}  // namespace memtrain::cli
