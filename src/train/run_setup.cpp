#include <torch/torch.h>

#include "memtrain/compat.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/model/dual_encoder.h"
#include "memtrain/model/unet3d.h"
#include "memtrain/train/model_state.h"
#include "memtrain/train/window_totals.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "run_state.h"

namespace memtrain {

std::array<int64_t, 3> RunState::roi() const {
  std::array<int64_t, 3> r = cfg.validation.roi;
  for (int i = 0; i < 3; ++i) {
    if (r[i] == 0)
      r[i] = cfg.data.patch_size[i];
  }
  return r;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(
    const TrainingConfig& cfg, const std::vector<at::Tensor>& params) {
  if (cfg.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(cfg.lr)
            .momentum(cfg.momentum)
            .weight_decay(cfg.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      params,
      torch::optim::AdamWOptions(cfg.lr).weight_decay(cfg.weight_decay));
}

namespace {

// A label other than 0 and 1 in a binary run's file: named by its first row.
void check_binary_labels(const DatasetInfo& info, const std::string& role) {
  for (size_t i = 0; i < info.row_labels.size(); ++i) {
    const int64_t y = info.row_labels[i];
    MT_CHECK(
        y == 0 || y == 1,
        role,
        " '",
        info.path,
        "': row ",
        i,
        " has label ",
        y,
        ", but model.num_classes=1 (a binary classifier) needs labels 0 and "
        "1 only; set model.num_classes=0 to train ",
        info.num_classes,
        " classes with a softmax, or write the labels as 0/1");
  }
}

// model.num_classes=1 and training.label_smoothing: classifiers of rows.
void check_classification(const RunState& run) {
  const DatasetInfo& ti = run.train_data->info();
  const bool rows = !run.volumes() && !run.episodic() && !ti.paired;
  const char* what = run.volumes()    ? "volumes (segmentation)"
                     : run.episodic() ? "few-shot episodes"
                                      : "pairs (contrastive)";
  MT_CHECK(
      !run.binary() || rows,
      "model.num_classes=1 (a binary classifier) applies to /features and "
      "/images rows, but data.train '",
      ti.path,
      "' is trained as ",
      what,
      "; set model.num_classes=0 (from the data)");
  MT_CHECK(
      run.cfg.training.label_smoothing == 0.0 || rows,
      "training.label_smoothing=",
      run.cfg.training.label_smoothing,
      " applies to classifiers of /features and /images rows, but data.train "
      "'",
      ti.path,
      "' is trained as ",
      what,
      "; set training.label_smoothing=0");
  if (!run.binary())
    return;
  check_binary_labels(ti, "data.train");
  if (run.val_data) {
    MT_CHECK(
        !run.volume_rows(),
        "model.num_classes=1 (a binary classifier): data.val '",
        run.val_data->info().path,
        "' has rows that belong to volumes, which are scored by Dice per "
        "class; use model.num_classes=0 (2 classes) there");
    check_binary_labels(run.val_data->info(), "data.val");
  }
}

void open_data(RunState& run) {
  OpenOptions opts;
  opts.intensity_scale = run.cfg.data.intensity_scale;
  opts.intensity_shift = run.cfg.data.intensity_shift;
  run.train_data.emplace(
      H5Dataset::open(run.cfg.data.train, "data.train", opts));
  const DatasetInfo& ti = run.train_data->info();
  const bool rank0 = run.comm.rank() == 0;
  if (!ti.checksummed)
    log_event(
        "warning: data.train: " + run.train_data->checksum_warning(), rank0);
  if (run.volumes()) {
    const std::string warn =
        run.train_data->patch_layout_warning(run.cfg.data.patch_size);
    if (!warn.empty()) {
      log_event("warning: data.train: " + warn, /*echo=*/run.comm.rank() == 0);
    }
  }
  // Few-shot runs validate on data.train's validation classes instead.
  if (!run.cfg.data.val.empty() && !run.episodic()) {
    run.val_data.emplace(H5Dataset::open(run.cfg.data.val, "data.val", opts));
    const DatasetInfo& vi = run.val_data->info();
    if (!vi.checksummed)
      log_event(
          "warning: data.val: " + run.val_data->checksum_warning(), rank0);
    // Volumes: validation volumes may have any size, not their channels.
    const bool same_shape =
        run.volumes() ? vi.sample_shape.at(0) == ti.sample_shape.at(0)
                      : vi.sample_shape == ti.sample_shape &&
                            vi.context_features == ti.context_features;
    MT_CHECK(
        vi.kind == ti.kind && vi.paired == ti.paired && same_shape,
        "data.val: '",
        vi.path,
        "' holds ",
        to_string(vi.kind),
        " of another shape than data.train '",
        ti.path,
        "'; both files must hold the same kind and sample shape");
    MT_CHECK(
        vi.num_classes <= ti.num_classes,
        "data.val: '",
        vi.path,
        "' has ",
        vi.num_classes,
        " classes but data.train '",
        ti.path,
        "' has ",
        ti.num_classes,
        "; the model is sized by data.train");
  }
  MT_CHECK(
      !run.cfg.validation.dump_predictions || run.volume_rows(),
      "validation.dump_predictions=true needs data.val with rows that belong "
      "to volumes (/volume_ids and /voxel_index, data/FORMAT.md); data.val ",
      run.cfg.data.val.empty() ? std::string("is not set")
                               : "'" + run.cfg.data.val + "' has none");
  run.classification.binary = run.cfg.model.num_classes == 1;
  run.classification.label_smoothing = run.cfg.training.label_smoothing;
  check_classification(run);
  run.num_classes =
      run.binary() ? 1 : std::max(ti.num_classes, run.cfg.model.num_classes);
  MT_CHECK(
      run.binary() || run.cfg.model.num_classes == 0 ||
          run.cfg.model.num_classes >= ti.num_classes,
      "model.num_classes=",
      run.cfg.model.num_classes,
      " but data.train '",
      ti.path,
      "' has labels up to ",
      ti.num_classes - 1,
      " (",
      ti.num_classes,
      " classes); set model.num_classes to at least ",
      ti.num_classes,
      " or 0 (from the data)");
  check_model_fits(
      run.cfg.model.name, ti.kind, ti.paired, "data.train '" + ti.path + "'");
  run.images =
      resolve_image_transforms(run.cfg, ti, run.episodic() || ti.paired);
  if (run.episodic()) {
    set_up_episodes(run);
  } else if (run.volumes()) {
    MT_CHECK(
        run.cfg.model.in_channels == 0 ||
            run.cfg.model.in_channels == ti.sample_shape[0],
        "model.in_channels=",
        run.cfg.model.in_channels,
        " but the volumes of data.train '",
        ti.path,
        "' have ",
        ti.sample_shape[0],
        " channel(s); set it to ",
        ti.sample_shape[0],
        " or 0 (from the data)");
    // The U-Net halves the patch depth-1 times: check the training patch
    // and the validation window now, not after an epoch.
    const int64_t div = unet3d_divisor(run.cfg.model.depth);
    const std::array<int64_t, 3> window = run.roi();
    for (int i = 0; i < 3; ++i) {
      MT_CHECK(
          run.cfg.data.patch_size[i] % div == 0 && window[i] % div == 0,
          "data.patch_size=[",
          run.cfg.data.patch_size[0],
          ", ",
          run.cfg.data.patch_size[1],
          ", ",
          run.cfg.data.patch_size[2],
          "] and validation.roi=[",
          window[0],
          ", ",
          window[1],
          ", ",
          window[2],
          "] must be multiples of ",
          div,
          " on every axis: model.depth=",
          run.cfg.model.depth,
          " halves them ",
          run.cfg.model.depth - 1,
          " time(s)");
    }
    run.patches = std::make_unique<PatchSampler>(
        *run.train_data,
        run.cfg.data.patch_size,
        run.cfg.data.patches_per_volume,
        run.cfg.data.pos_fraction,
        static_cast<uint64_t>(run.cfg.data.seed),
        run.cfg.data.flip);
    run.source = std::make_unique<PatchSource>(
        *run.train_data, *run.patches, &run.train_finite);
  } else {
    run.source = std::make_unique<RowSource>(
        *run.train_data, run.images.train, &run.train_finite);
  }
}

void build_model(RunState& run) {
  const TrainConfig& cfg = run.cfg;
  const DatasetInfo& ti = run.train_data->info();
  // Parameters, gradient buckets and (later) optimizer state are device
  // memory: create them inside the device scope, on the device.
  memory::DeviceScope device;
  std::vector<int64_t> shape = ti.sample_shape;
  if (run.volumes()) {  // the model sees patches
    shape = {ti.sample_shape[0]};
    shape.insert(
        shape.end(), cfg.data.patch_size.begin(), cfg.data.patch_size.end());
  }
  const ModelInput input{ti.kind, shape, run.num_classes, ti.context_features};
  if (run.episodic()) {
    run.fewshot = make_fewshot_model(cfg.model, input);
    run.model = run.fewshot;
  } else if (ti.paired) {
    run.dual = make_dual_encoder(cfg.model, input);
    run.model = run.dual;
  } else {
    run.model = make_model(cfg.model, input);
  }
  run.model->to(run.placement.device());
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
        !run.placement.is_cuda() || run.comm.backend() != "mpi",
        "model.sync_bn: true on a CUDA device needs dist.backend=nccl: "
        "batch-norm's backward sums run on autograd's device thread, where "
        "MPI may not be called");
    Communicator& comm = run.comm;
    run.model->set_batch_norm_sync(
        [&comm](at::Tensor& t) { comm.all_reduce_batch_norm(t); },
        cfg.model.name);
    run.sync_bn = true;
  }
  run.optimizer = make_optimizer(cfg.training, run.trainable);
  run.sampler = std::make_unique<ShardedSampler>(
      run.patches      ? run.patches->num_samples()
      : run.episodic() ? cfg.data.episodes.per_epoch  // Note [Episodes]
                       : ti.num_samples,
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
      cfg.data.prefetch,
      cfg.data.read_threads,
      run.placement.pinned_host_buffers());
}

}  // namespace

std::unique_ptr<RunState> set_up_run(
    const TrainConfig& cfg, Communicator& comm, const Placement& placement) {
  MT_CHECK(
      cfg.training.amp != "fp16" || placement.is_cuda(),
      "training.amp=fp16 needs a CUDA device (fp16 autocast and the loss "
      "scaler run on GPUs), but this rank's device is ",
      placement.describe(),
      "; use training.amp=bf16 on a CPU");
  compat::set_deterministic(cfg.training.deterministic);
  auto run = std::make_unique<RunState>(cfg, comm, placement);
  run->budget = resolve_budget(cfg.memory.budget, cfg.memory.headroom);
  run->shape = WindowShape::from_config(cfg, comm.size());
  // The budget is the whole process's (Note [A budget is the whole
  // process]): what it holds outside the allocator comes off the cap.
  if (run->budget.limited()) {
    run->budget.outside = memory::measure_outside();
    MT_CHECK(
        run->budget.outside < run->budget.bytes,
        "memory.budget=",
        cfg.memory.budget,
        " (",
        format_bytes(static_cast<double>(run->budget.bytes)),
        ") does not even cover what this process holds on ",
        placement.describe(),
        " outside the caching allocator (",
        format_bytes(static_cast<double>(run->budget.outside)),
        ": the CUDA context, cuBLAS/cuDNN and NCCL, or another process on "
        "this GPU); raise memory.budget, or give this rank a GPU of its own");
  }
  // A run starts from an empty cache and a fresh peak, whatever ran in
  // this process before it.
  memory::release_cache();
  memory::reset_peak();
  memory::set_cap(run->budget.allocator_cap());
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
        cfg.memory.budget,
        " (",
        format_bytes(static_cast<double>(run->budget.bytes)),
        ") is too small for the model itself: its parameters and gradient "
        "buckets need more than that (",
        format_bytes(double(st.reserved)),
        " allocated when it ran out); raise memory.budget or use a smaller "
        "model"));
  }
  run->scaler = std::make_unique<LossScaler>(
      cfg.training.amp == "fp16",
      cfg.training.amp_init_scale,
      cfg.training.amp_growth_interval);
  // Every rank initialised the same parameters from model.seed; from here
  // on each rank draws (dropout) from a stream of its own.
  placement.seed_rng(static_cast<uint64_t>(cfg.training.seed), comm.rank());
  return run;
}

}  // namespace memtrain
