#pragma once
// Private to src/train/: run checkpoints and resume (Note [Checkpoint
// format] in checkpoint.cpp holds the file format).

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "train/state/run_state.h"

namespace memtrain {

// Where a run continues: the window after a checkpoint.
struct ResumePoint {
  bool resumed = false;
  int64_t step = 0;  // windows done, this run and before it
  int64_t epoch = 0;
  int64_t window = 0;       // within the epoch
  double epoch_loss = 0.0;  // loss sum of the epoch's windows before it
};

// Collective (every rank's random state travels to rank 0); rank 0 writes
// output.dir/checkpoints/ckpt-<step> atomically when `writer`, prunes old
// ones and returns its `type: "checkpoint"` record (null on other ranks).
nlohmann::json save_run_checkpoint(
    RunState& run,
    const RunCounters& counters,
    bool writer,
    int64_t step,
    int64_t epoch,
    int64_t samples_done,
    double loss_sum);

// Local. Loads the checkpoint `spec` names (a file, a folder's newest
// valid one, or "auto"), checks it against this run and copies its state
// into `run` and `counters`. Throws memtrain::Error naming the file and
// why. `what` receives the log line.
ResumePoint resume_run(
    RunState& run,
    RunCounters& counters,
    const std::string& spec,
    std::string& what);

}  // namespace memtrain
