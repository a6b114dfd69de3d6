#pragma once
// Checkpoints: everything a run needs to continue exactly where it stopped,
// in one file in the safetensors format (so any safetensors reader can look
// inside). See Note [Checkpoint format] in checkpoint.cpp.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "memtrain/weights/safetensors.h"

namespace memtrain {

struct CheckpointState {
  int64_t step = 0;             // windows completed in all
  int64_t epoch = 0;            // the epoch to continue in
  int64_t epoch_samples = 0;    // samples of that epoch already trained on
  double epoch_loss_sum = 0.0;  // their summed loss (for the epoch record)
  int64_t world_size = 1;       // of the run that wrote it
  int64_t effective_batch = 0;
  std::string model;        // model.name
  std::string config_yaml;  // the resolved config
  double loss_scale = 1.0;
  int64_t scaler_good_steps = 0;
  int64_t scaler_skipped = 0;  // skipped windows so far (fp16 or not)
  int64_t nonfinite_in_a_row = 0;
  // best.safetensors so far: validation.best_metric, its value (NaN: none
  // yet) and the step it was reached at.
  std::string best_metric;
  double best_value = std::numeric_limits<double>::quiet_NaN();
  int64_t best_step = -1;
};

struct Checkpoint {
  std::string path;
  bool metadata_checked = true;  // false: format 1, tensors only
  CheckpointState state;
  // The model's parameters and buffers (weights/model_state.h):
  // "fc1.weight", "bn1.running_mean", ... (host; float32, int64 for batch-norm
  // counters).
  NamedTensors params;
  std::string optimizer;        // LibTorch's optimizer archive, as bytes
  std::vector<at::Tensor> rng;  // one CPU generator state per rank
  // One device (CUDA) generator state per rank; empty for CPU runs.
  std::vector<at::Tensor> rng_device;
};

// Writes atomically (temporary file, fsync, rename). Throws memtrain::Error.
void save_checkpoint(const std::string& path, const Checkpoint& ckpt);

// Reads and verifies (format, checksum, completeness). Throws
// memtrain::Error naming the file and what is wrong.
Checkpoint load_checkpoint(const std::string& path);

// "DIR/checkpoints/ckpt-00000042.safetensors" for step 42.
std::string checkpoint_path(const std::string& output_dir, int64_t step);

// Checkpoint files in DIR/checkpoints (or DIR itself), newest step first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// After writing the checkpoint of `current_step`: deletes checkpoints of
// later steps (left by a run that was resumed from an earlier one: another
// timeline, which --resume auto must not pick), then all but the `keep`
// newest of the rest.
void prune_checkpoints(
    const std::string& output_dir, int64_t keep, int64_t current_step);

}  // namespace memtrain
