#pragma once
// A run's output.dir may hold another run's work: checkpoints, metrics and
// weights that a fresh run would truncate, overwrite or prune. A fresh run
// is refused there unless the user says which way out (Note [Output
// folders] in output_dir.cpp).

#include <string>
#include <vector>

namespace memtrain {

// What of a previous run `dir` holds (paths relative to it): checkpoints,
// metrics.jsonl (non-empty), model.safetensors, best.safetensors. Empty:
// the folder is free (or does not exist).
std::vector<std::string> previous_run_files(const std::string& dir);

// Throws memtrain::Error naming the folder, what it holds and the ways out
// (--resume auto, --output.overwrite=true, another output.dir) when a fresh
// run (`resuming` false) without `overwrite` would start in a used folder.
void check_output_dir(const std::string& dir, bool resuming, bool overwrite);

// --output.overwrite=true: deletes the previous run's checkpoints, metrics
// (metrics.jsonl, metrics.csv), event files (tb/), validation overlays
// (val/), weights (model, best, initial .safetensors), memory_plan.json and
// progress.png. Rank logs and
// anything memtrain does not write are left alone. Returns what it deleted.
std::vector<std::string> clear_previous_run(const std::string& dir);

}  // namespace memtrain
