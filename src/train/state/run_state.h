#pragma once
// Private to src/train/: what one training run is made of. set_up_run()
// builds it once from the config (data, model, optimizer, sampler,
// gradient buckets, loss scaler, the window's shape); the parts of the
// trainer -- planning, the window loop, validation, run checkpoints,
// records -- take it and the counters they change as explicit inputs.

#include <torch/torch.h>

#include <array>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/sharded_sampler.h"
#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/gradient_sync.h"
#include "memtrain/input/batch_loader.h"
#include "memtrain/input/image_augment.h"
#include "memtrain/input/prefetcher.h"
#include "memtrain/memory/budget.h"
#include "memtrain/memory/host_plan.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/memory/monitor.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/memory/planner.h"
#include "memtrain/model/models.h"
#include "memtrain/train/state/loss_scaler.h"
#include "memtrain/train/state/results.h"

namespace memtrain {

class Task;

struct RunState {
  RunState(const TrainConfig& c, Communicator& cm, const Placement& p);
  ~RunState();

  const TrainConfig cfg;
  Communicator& comm;
  const Placement& placement;
  Budget budget;  // memory.budget, parsed once

  std::optional<H5Dataset> train_data;
  std::optional<H5Dataset> val_data;
  // NaN/Inf in the samples read (training.nonfinite).
  FiniteCheck train_finite{
      "data.train", cfg.training.nonfinite == Nonfinite::kStop};
  FiniteCheck val_finite{
      "data.val", cfg.training.nonfinite == Nonfinite::kStop};
  // What differs between kinds of run (tasks/task.h), chosen from the
  // config and data.train. Declared before what reads the samplers it owns.
  std::unique_ptr<Task> task;
  std::unique_ptr<SampleSource> source;
  std::unique_ptr<Prefetcher> loader;
  int64_t num_classes = 0;  // the model's outputs (1: binary)
  // /images rows: what RowSource does to training and validation samples
  // (Note [Image augmentation]).
  ImageTransforms images;

  std::shared_ptr<Classifier> model;
  // model.feature_cache=host: the model's (Note [The feature cache]),
  // capacity set by the host plan; null otherwise.
  std::shared_ptr<FeatureCache> feature_cache;
  std::vector<at::Tensor> params;     // all of them, registration order
  std::vector<at::Tensor> trainable;  // those not frozen (model.freeze)
  std::vector<at::Tensor> buffers;    // batch-norm statistics (ResNets)
  std::vector<std::string> frozen;    // the frozen parameters' names
  // model.sync_bn at more than one rank: the model's batch-norm sums its
  // statistics over the ranks (Note [Batch-norm and data parallelism]);
  // every rank then runs the same micro-steps (micro_batches()) and an
  // OOM is not replayed.
  bool sync_bn = false;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<ShardedSampler> sampler;
  std::unique_ptr<GradientSync> grad_sync;
  std::unique_ptr<LossScaler> scaler;

  WindowShape shape;  // micro-batch and steps set by planning
  MemoryPlan plan;    // what planning decided and measured
  // Where offloaded activations wait (Note [Host offload]), when the
  // checkpointing mode may offload; installed as memory::offload_pool()
  // for the run's life, capped at what the host plan's other holders
  // leave.
  std::shared_ptr<memory::HostPool> host_pool;
  // What this rank holds in host memory against its host budget, charged
  // after planning (Note [Host plan]).
  memory::HostPlan host_plan;
  // What the host plan before planning charged the loader at (its
  // micro-batch) and left unused, for the probes (host_deficit()).
  int64_t host_charged_micro = 1;
  int64_t host_left = 0;

  // The validation window: validation.roi, or the training patch.
  std::array<int64_t, 3> roi() const;
};

// What changes as the run goes: counters the records and checkpoints
// read, the memory monitor, this rank's validation batch.
struct RunCounters {
  int64_t nonfinite_in_a_row = 0;
  int64_t nonfinite_skips = 0;    // non-fp16 windows skipped
  int64_t releases_at_start = 0;  // memory::stats().cache_releases
  int64_t measured_peak = 0;      // largest window peak (reserved), all ranks
  int64_t val_micro = 0;          // validation batch (halved on OOM)
  memory::Monitor monitor;
  std::vector<at::Tensor> test_leak;  // memory.test_leak_kib_per_window
  bool test_oom_done = false;         // memory.test_oom_rank
  // best.safetensors: its metric's value (NaN: none yet) and step; carried
  // in checkpoints.
  double best_value = std::numeric_limits<double>::quiet_NaN();
  int64_t best_step = -1;
};

// Opens and checks the data, builds model, optimizer, sampler, gradient
// buckets and prefetcher on the placement's device (device memory domain),
// seeds this rank's random stream. Local, no collective.
std::unique_ptr<RunState> set_up_run(
    const TrainConfig& cfg, Communicator& comm, const Placement& placement);

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const TrainingConfig& cfg, const std::vector<at::Tensor>& params);

// --- the micro-step (micro_step.cpp) ---------------------------------------

// Samples `ids` of `epoch` from `from` (host memory), copied to the device;
// the host buffers go back to `from`.
Batch load_batch(
    const RunState& run,
    Prefetcher& from,
    int64_t epoch,
    const std::vector<int64_t>& ids);
// A host batch copied to the placement's device.
Batch to_device(const RunState& run, const Batch& host);
// The model under autocast (training.amp) on the placement's device type;
// float32 logits. `origins`: where x's samples come from (Batch::origin),
// for the model's feature cache.
at::Tensor forward(
    RunState& run,
    const at::Tensor& x,
    const at::Tensor& context,
    const at::Tensor& origins = {});
// Read, forward, backward of the weighted, scaled loss; adds the unweighted
// loss sum to `loss_sum` (a float64 (1,) tensor on the device: no host read,
// Note [One host read per window]). Everything else it creates is freed
// when it returns.
void micro_step(
    RunState& run,
    int64_t epoch,
    const std::vector<int64_t>& indices,
    double weight,
    const at::Tensor& loss_sum);
// A zero loss sum for micro_step(): float64 (1,) on the device.
at::Tensor zero_loss_sum(const RunState& run);

// --- the window (window.cpp) -----------------------------------------------

// This rank's micro-batches of `wp` at micro-batch `micro`:
// split_micro_batches, or with run.sync_bn the agreed count of near-equal
// ones (split_micro_batches_evenly), the same on every rank.
std::vector<std::vector<int64_t>> micro_batches(
    const RunState& run, const WindowPlan& wp, int64_t micro);

// Every micro-batch size (largest first) that micro_batches() gives any
// rank in any window of an epoch at micro-batch `micro`: a full window's
// and the epoch's last (Note [Planning] probes them all).
std::vector<int64_t> micro_batch_sizes(const RunState& run, int64_t micro);

// One accumulation window: micro-steps (no communication; OOM replays),
// one all-reduce of the gradient and the window's totals, the update.
// Collective. `next` is the window after it (read ahead), or null.
WindowResult run_window(
    RunState& run,
    RunCounters& counters,
    const WindowPlan& plan,
    const WindowPlan* next);

// Note [Cache policy]: releases cached device blocks before validation, or
// when the cached bytes pass memory.release_threshold x the budget.
void release_cache_if_due(const RunState& run, bool before_validation);

// Validation: train/loop/validate.h (the task's), train/eval/val_batches.h
// (what the tasks share).

// --- the host plan (host_planning.cpp) --------------------------------------

// Collective. Note [Host plan]: charges this rank's holders of host memory
// against its host budget (memory.host_budget) once planning has chosen the
// micro-batch and tier; sets run.host_plan. A plan over its budget throws
// memtrain::Error on every rank, the refused rank's with each holder's
// arithmetic. With `may_replan`, on the CPU device, a plan whose peak no
// longer fits what the other holders leave after the probes (they grew
// the outside) lowers the cap to that instead and returns false on every
// rank: plan_run() again, then plan_host(run, false).
bool plan_host(RunState& run, bool may_replan);
// Collective. Before planning: charges the holders, the loader's at the
// fixed micro-batch or 1; on the CPU device, whose memory is host memory,
// lowers memory.budget's cap to what they leave, so that the device
// domain runs out -- an out-of-memory the planner and the replay handle --
// before the host does. Refuses as plan_host does when the model alone
// does not fit; returns what is left for the offload pool.
int64_t fit_host_before_planning(RunState& run);
// On the CPU device under a host plan: the bytes by which a micro-batch of
// `micro` (whose probe held `offloaded` bytes in the host pool) passes
// what fit_host_before_planning left -- the loader's buffers grow with the
// micro-batch -- and so takes from the device domain's cap; 0 elsewhere.
// A probe fits only when its peak and this fit under the usable budget.
int64_t host_deficit(const RunState& run, int64_t micro, int64_t offloaded);

// --- planning (planning.cpp) -------------------------------------------------

// Collective. On the CPU device under a host plan: one probe (micro-batch
// 2, no checkpointing), then fit_host_before_planning() again, so that the
// kernels the probes load and the caches they fill are in the outside the
// cap is fitted to before planning (a small U-Net's: 175 MiB without
// probes, 213 MiB after them; without the warm-up its probes peaked at
// 381 MiB under a host budget of 340). Nothing elsewhere.
void warm_up_host_plan(RunState& run);

// Collective. Plans the micro-batch and checkpointed segments (see
// memory/planner.h), agrees on them across ranks, sets run.plan and
// run.shape. Leaves parameters and random streams as it found them. With
// `faster_forms`, a model's faster form where it fits the plan (Note
// [Planning the faster form]); without, its lean form.
void plan_run(RunState& run, bool faster_forms = true);

}  // namespace memtrain
