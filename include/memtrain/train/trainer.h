#pragma once
// Trainer: the training loop of one rank. Each accumulation window runs K
// micro-steps with no communication, then one bucketed all-reduce of the
// gradient, then the optimizer step (DESIGN.md, "The training step").

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/train/safetensors.h"

namespace memtrain {

class Communicator;

struct WindowResult {
  int64_t epoch = 0;
  int64_t window = 0;       // within the epoch
  int64_t step = 0;         // windows run so far in this run, this one included
  double loss = 0.0;        // mean loss over the window's global samples
  int64_t samples = 0;      // global samples in the window
  int64_t micro_steps = 0;  // micro-batches this rank ran
  int64_t allreduce_calls = 0;  // collectives in this window
  int64_t allreduce_bytes = 0;  // bytes all-reduced in this window
  double seconds = 0.0;
  double data_wait_s = 0.0;
};

struct ValResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t samples = 0;
};

struct TrainSummary {
  int64_t windows = 0;
  std::vector<WindowResult> window_results;
  std::vector<ValResult> validations;  // one per completed epoch with val
  uint64_t checksum = 0;               // of this rank's final parameters
};

class Trainer {
 public:
  struct Options {
    // Rank 0 writes output.dir (metrics.jsonl, model.safetensors,
    // config.resolved.yaml). Off for in-process reference runs in tests.
    bool write_outputs = true;
    // Rank 0's progress stream; null for none.
    std::FILE* progress = nullptr;
    bool progress_is_tty = false;
  };

  // Opens and checks the data, builds model, optimizer, sampler and gradient
  // buckets; rank 0 creates output.dir. No collective: a memtrain::Error
  // thrown here is local, and callers agree on failure across ranks before
  // anyone calls run().
  Trainer(const TrainConfig& cfg, Communicator& comm, Options options);
  ~Trainer();

  // Collective. Trains until training.epochs or training.max_windows.
  TrainSummary run();

  // What will run: data, model, window shape (for the launch banner).
  std::string describe() const;

  NamedTensors named_parameters() const;
  int64_t windows_per_epoch() const;
  int64_t effective_batch() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrain
