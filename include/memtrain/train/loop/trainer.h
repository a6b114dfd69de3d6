#pragma once
// Trainer: the training loop of one rank. Each accumulation window runs K
// micro-steps with no communication, then one bucketed all-reduce of the
// gradient, then the optimizer step (DESIGN.md, "The training step").

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/memory/host_plan.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/memory/planner.h"
#include "memtrain/train/state/results.h"
#include "memtrain/weights/safetensors.h"

namespace memtrain {

class Communicator;
class Placement;

class Trainer {
 public:
  struct Options {
    // Rank 0 writes output.dir (metrics.jsonl, model.safetensors,
    // config.resolved.yaml). Off for in-process reference runs in tests.
    bool write_outputs = true;
    // Rank 0's progress stream; null for none.
    std::FILE* progress = nullptr;
    bool progress_is_tty = false;
    // Where this rank trains (device/placement.h); null: the CPU, with the
    // accounting allocator (tests).
    const Placement* placement = nullptr;
    // A model with a faster and a lean form runs the faster without
    // memory.budget, and under one where it fits the plan (Note [Planning
    // the faster form]); false: the lean form always (tests and
    // benchmarks that measure it).
    bool faster_forms = true;
  };

  // Opens and checks the data, builds model, optimizer, sampler and gradient
  // buckets on the placement's device, caps device memory at memory.budget;
  // rank 0 creates output.dir. No collective: a memtrain::Error thrown here
  // is local, and callers agree on failure across ranks before going on.
  Trainer(const TrainConfig& cfg, Communicator& comm, Options options);
  ~Trainer();

  // Collective. Plans memory (micro-batch, accumulation steps, checkpointed
  // segments: see memory/planner.h) and agrees on the plan across ranks;
  // run() writes memory_plan.json. A memtrain::Error (nothing fits) is
  // thrown on every rank alike. run() calls it if nobody did.
  void prepare();

  // After prepare(); local, no collective (callers agree on failure). Loads
  // the checkpoint `spec` names -- a file, a folder's newest valid one, or
  // "auto" (output.dir's newest valid one; none at all starts from the
  // beginning) -- and continues from the window after it. Refuses, with a
  // memtrain::Error naming the file and why, a checkpoint that is corrupt,
  // from another model, of other shapes, or whose position does not fall on
  // a window boundary of this run. Returns what it did, for the log.
  std::string resume(const std::string& spec);

  // After resume() (or without it); local, no collective (callers agree on
  // failure). With model.pretrained set and the run not resumed (the
  // checkpoint wins): loads the file's tensors into the model by name and
  // shape (weights/model_state.h), the same on every rank. Throws
  // memtrain::Error for a file that cannot be read and, with
  // model.pretrained_strict, for any missing, unexpected or
  // shape-mismatched tensor, naming them. Returns the report's lines (none
  // when nothing was loaded); run() writes it to metrics.jsonl as a
  // `type: "pretrained"` record. Runs once; run() calls it if nobody did.
  std::vector<std::string> load_pretrained();

  // Local: loads a weights file (parameters and buffers by name, strict),
  // in place of model.pretrained. Throws memtrain::Error naming what
  // differs.
  void load_weights(const std::string& path);

  // Empty when this run can validate (data.val, or validation episodes);
  // else why not and the fix.
  std::string cannot_validate() const;

  // Collective: the validation of a training run (validate()) on data.val
  // with the model as it is, nothing written. Returns the record as JSON
  // (the validation record's fields, type "eval", ranks) and `line`, the
  // progress line's words.
  std::string evaluate(std::string* line = nullptr);

  // Collective. Trains until training.epochs or training.max_windows
  // (counted from the beginning of the run, across resumes).
  TrainSummary run();

  // What will run: data, model, window shape (for the launch banner).
  std::string describe() const;

  NamedTensors named_parameters() const;
  int64_t windows_per_epoch() const;
  int64_t effective_batch() const;
  // Segments running checkpointed (after prepare()), and whether they keep
  // their convolutions' outputs (Note [Selective recompute]).
  int64_t checkpointed_segments() const;
  bool selective_recompute() const;
  // The memory plan (after prepare()): micro-batch, tier, every probe.
  const MemoryPlan& memory_plan() const;
  // The host plan (Note [Host plan]): this rank's host budget and its
  // holders, after prepare().
  const memory::HostPlan& host_plan() const;
  // The host offload pool's counters (Note [Host offload]); zeros when the
  // checkpointing mode does not offload.
  memory::HostPoolStats host_pool_stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrain
