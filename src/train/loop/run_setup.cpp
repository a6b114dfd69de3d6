#include <torch/torch.h>

#include <cstdlib>

#include "memtrain/infer/device_setup.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/model/registry.h"
#include "memtrain/model/volume_model.h"
#include "memtrain/train/state/optimizers.h"
#include "memtrain/train/state/window_totals.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "memtrain/weights/model_state.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {

RunState::RunState(const TrainConfig& c, Communicator& cm, const Placement& p)
    : cfg(c), comm(cm), placement(p) {}

RunState::~RunState() {
  if (host_pool && memory::offload_pool() == host_pool)
    memory::set_offload_pool(nullptr);
}

std::array<int64_t, 3> RunState::roi() const {
  return validation_roi(cfg);
}

// Note [Multi-tensor optimizers]: foreach, or fused for CUDA parameters.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const TrainingConfig& cfg, const std::vector<at::Tensor>& params) {
  const StepKernel kernel = step_kernel_for(
      params.empty() ? c10::Device(c10::kCPU) : params.front().device());
  switch (cfg.optimizer) {
    case Optimizer::kSgd:
      return std::make_unique<MultiTensorSGD>(
          params,
          torch::optim::SGDOptions(cfg.lr)
              .momentum(cfg.momentum)
              .weight_decay(cfg.weight_decay),
          kernel);
    case Optimizer::kAdamw:
      break;
  }
  return std::make_unique<MultiTensorAdamW>(
      params,
      torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay),
      kernel);
}

namespace {

// data.train opened and checked, the task chosen and set up (Note
// [Tasks]): it opens data.val, checks the config against the data and
// builds the sample source.
void open_data(RunState& run) {
  OpenOptions opts;
  opts.intensity_scale = run.cfg.data.intensity_scale;
  opts.intensity_shift = run.cfg.data.intensity_shift;
  run.train_data.emplace(
      H5Dataset::open(run.cfg.data.train, "data.train", opts));
  const DatasetInfo& ti = run.train_data->info();
  if (!ti.checksummed) {
    log_event(
        "warning: data.train: " + run.train_data->checksum_warning(),
        /*echo=*/run.comm.rank() == 0);
  }
  check_model_fits(
      run.cfg.model.name, ti.kind, ti.paired, "data.train '" + ti.path + "'");
  run.task = make_task(run.cfg, ti);
  run.task->set_up(run);
  MT_CHECK(
      !run.cfg.validation.dump_predictions || run.task->dumps_predictions(),
      "validation.dump_predictions=true needs data.val with rows that belong "
      "to volumes (/volume_ids and /voxel_index, docs/data-format.md); "
      "data.val ",
      run.cfg.data.val.empty() ? std::string("is not set")
                               : "'" + run.cfg.data.val + "' has none");
}

void build_model(RunState& run) {
  const TrainConfig& cfg = run.cfg;
  // Parameters, gradient buckets and (later) optimizer state are device
  // memory: create them inside the device scope, on the device.
  memory::DeviceScope device;
  run.model = run.task->make_model(run);
  run.model->to(run.placement.device());
  if (channels_last_on(cfg.model, run.placement))
    run.model->to_channels_last();
  // Without a budget nothing asks for the memory: the faster forms.
  run.model->set_memory_lean(run.budget.limited());
  if (cfg.model.feature_cache == FeatureCacheMode::kHost) {
    run.feature_cache = std::make_shared<FeatureCache>(run.placement.is_cuda());
    run.model->set_feature_cache(run.feature_cache);
  }
  run.model->train();
  // Frozen parameters get no gradient, no optimizer state and no place in
  // the gradient buckets.
  run.frozen = freeze_parameters(*run.model, cfg.model.freeze);
  run.params = run.model->parameters();
  for (const auto& p : run.params) {
    if (p.requires_grad())
      run.trainable.push_back(p);
  }
  MT_CHECK(
      !run.trainable.empty(),
      "model.freeze freezes every parameter of model.name=",
      cfg.model.name,
      ": nothing would train");
  run.buffers = run.model->buffers();
  // model.sync_bn: batch-norm's statistics summed over the ranks; with one
  // rank there is nothing to sum (Note [Batch-norm and data parallelism]).
  if (cfg.model.sync_bn && run.comm.size() > 1) {
    MT_CHECK(
        !run.placement.is_cuda() || run.comm.backend() != BackendChoice::kMpi,
        "model.sync_bn: true on a CUDA device needs dist.backend=nccl: "
        "batch-norm's backward sums run on autograd's device thread, where "
        "MPI may not be called");
    Communicator& comm = run.comm;
    run.model->set_batch_norm_sync(
        [&comm](at::Tensor& t) { comm.all_reduce_batch_norm(t); },
        to_string(cfg.model.name));
    run.sync_bn = true;
  }
  run.optimizer = make_optimizer(cfg.training, run.trainable);
  run.sampler = std::make_unique<ShardedSampler>(
      run.task->samples_per_epoch(run),
      run.shape.effective_batch,
      run.comm.rank(),
      run.comm.size(),
      static_cast<uint64_t>(cfg.data.seed),
      cfg.data.drop_last);
  MT_INTERNAL_ASSERT(run.sampler->max_rank_share() == run.shape.rank_share);
  run.grad_sync = std::make_unique<GradientSync>(
      run.comm,
      run.trainable,
      static_cast<int64_t>(cfg.dist.bucket_mib * 1024.0 * 1024.0),
      WindowTotals::size(run.comm.size()));
  run.loader = std::make_unique<Prefetcher>(
      *run.source,
      // auto: none until the host plan chooses (host_planning.cpp).
      cfg.data.prefetch == kPrefetchAuto ? 0 : cfg.data.prefetch,
      cfg.data.read_threads,
      run.placement.pinned_host_buffers());
}

// The host pool, when the checkpointing mode may offload (offload; auto
// with a budget, whose ladder ends with it).
void set_up_host_pool(RunState& run, int64_t cap) {
  const Checkpointing mode = run.cfg.training.gradient_checkpointing;
  if (!ladder_offloads(mode, run.model->num_segments()) ||
      (mode == Checkpointing::kAuto && !run.budget.limited()))
    return;
  // At least a byte: a pool of 0 would have no cap.
  const int64_t bytes = std::max<int64_t>(1, cap);
  run.host_pool = std::make_shared<memory::HostPool>(bytes);
  memory::set_offload_pool(run.host_pool);
}

}  // namespace

std::unique_ptr<RunState> set_up_run(
    const TrainConfig& cfg, Communicator& comm, const Placement& placement) {
  check_model_config(cfg);
  auto run = std::make_unique<RunState>(cfg, comm, placement);
  run->budget = start_on_device(cfg, placement);
  run->shape =
      WindowShape::for_batch(cfg.effective_batch(comm.size()), comm.size());
  open_data(*run);
  try {
    build_model(*run);
  } catch (const c10::OutOfMemoryError&) {
    const memory::Stats st = memory::stats();
    if (!run->budget.limited()) {
      // No budget: the device itself ran out.
      throw Error(detail::concat(
          "the model itself does not fit in the memory of ",
          placement.describe(),
          ": its parameters and gradient buckets ran out with ",
          format_bytes(double(st.reserved)),
          " allocated (no memory.budget is set); use a smaller model "
          "(model.hidden, model.depth) or a device "
          "with more memory"));
    }
    throw Error(detail::concat(
        "memory.budget=",
        cfg.memory.budget.text(),
        " (",
        format_bytes(static_cast<double>(run->budget.bytes)),
        ") is too small for the model itself: its parameters and gradient "
        "buckets need more than that (",
        format_bytes(double(st.reserved)),
        " allocated when it ran out); raise memory.budget or use a smaller "
        "model"));
  }
  set_up_host_pool(*run, fit_host_before_planning(*run));
  run->scaler = std::make_unique<LossScaler>(
      cfg.training.amp == Amp::kFp16,
      cfg.training.amp_init_scale,
      cfg.training.amp_growth_interval);
  // Every rank initialised the same parameters from model.seed; from here
  // on each rank draws (dropout) from a stream of its own.
  placement.seed_rng(static_cast<uint64_t>(cfg.training.seed), comm.rank());
  return run;
}

}  // namespace memtrain
