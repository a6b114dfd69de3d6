#include "memtrain/train/trainer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "memtrain/compat.h"
#include "memtrain/data/h5_dataset.h"
#include "memtrain/data/patch_sampler.h"
#include "memtrain/data/sharded_sampler.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/dist/gradient_sync.h"
#include "memtrain/dist/replica_check.h"
#include "memtrain/memory/budget.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/monitor.h"
#include "memtrain/memory/planner.h"
#include "memtrain/model/models.h"
#include "memtrain/model/unet3d.h"
#include "memtrain/train/batch_loader.h"
#include "memtrain/train/checkpoint.h"
#include "memtrain/train/loss_scaler.h"
#include "memtrain/train/losses.h"
#include "memtrain/train/metrics.h"
#include "memtrain/train/prefetcher.h"
#include "memtrain/train/progress.h"
#include "memtrain/train/sliding_window.h"
#include "memtrain/train/stop_request.h"
#include "memtrain/train/validator.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {

// Note [Window weighting]
// A window's update must equal one step on its global batch of n samples
// (DESIGN.md semantics 1), however the n samples are split over ranks and
// micro-steps, and whatever size the last micro-batch has. Each micro-step
// therefore back-propagates sum(per-sample loss) / n, with n the window's
// global sample count that every rank knows from the sampler, and the
// boundary all-reduce *sums* over ranks. The sum of all those gradients is
// exactly the gradient of the mean loss over the n samples: the division
// happens once, in the loss, and no rank divides by the world size or by K.
// The same weighting makes OOM recovery exact: a rank that re-splits its
// share into smaller micro-batches produces the same gradient.

// Note [OOM recovery]
// An out-of-memory error in a micro-step unwinds it (its graph and tensors
// are freed as the exception passes). The guard then drops the gradients
// accumulated so far in the window, releases cached blocks, halves this
// rank's micro-batch and replays the window from its first micro-step. Only
// this rank changes its split; no collective has happened yet in the window,
// so the others simply wait at the boundary. By Note [Window weighting] the
// update is the one the smaller micro-batch would have given from the start.
// The smaller micro-batch stays for the rest of the run. The boundary itself
// (all-reduce, optimizer step) is not replayed: its memory was measured by
// the planner's probes.

namespace {

// Carried in the last gradient bucket: [loss sum, sample count, stop
// requests]. See Note [All-reduce only at the accumulation boundary].
constexpr int64_t kExtras = 3;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  Communicator& comm;
  Options options;
  bool writer = false;  // rank 0 with outputs on

  std::optional<H5Dataset> train_data;
  std::optional<H5Dataset> val_data;
  std::shared_ptr<Classifier> model;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::unique_ptr<ShardedSampler> sampler;
  std::unique_ptr<GradientSync> grad_sync;
  std::unique_ptr<PatchSampler> patches;  // volumes
  std::unique_ptr<SampleSource> source;
  std::unique_ptr<Prefetcher> loader;
  int64_t num_classes = 0;  // the model's outputs
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<Progress> progress;

  Budget budget;
  bool prepared = false;
  MemoryPlan plan;
  int64_t micro = 0;  // this rank's micro-batch (halved by the OOM guard)
  int64_t val_micro = 0;
  int64_t measured_peak = 0;      // largest window peak of the run
  int64_t releases_at_start = 0;  // memory::stats().cache_releases
  std::unique_ptr<LossScaler> scaler;
  memory::Monitor monitor;
  std::unique_ptr<memory::LeakDetector> leak;
  std::vector<at::Tensor> test_leak;  // memory.test_leak_kib_per_window

  // Where run() starts (a resumed checkpoint's position).
  bool resumed = false;
  int64_t start_step = 0;
  int64_t start_epoch = 0;
  int64_t start_window = 0;
  int64_t nonfinite_in_a_row = 0;
  int64_t nonfinite_skips = 0;
  double start_epoch_loss = 0.0;  // loss sum of the start epoch's done part

  Impl(const TrainConfig& c, Communicator& comm_, Options o)
      : cfg(c), comm(comm_), options(o) {}

  void open_data();
  void build_model();
  std::unique_ptr<torch::optim::Optimizer> make_optimizer();
  Batch to_device(Batch b) const;
  Batch load(
      Prefetcher& from, int64_t epoch, const std::vector<int64_t>& ids) const;
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context);
  torch::Tensor loss_sum(
      const torch::Tensor& logits, const torch::Tensor& y) const;
  double micro_step(
      int64_t epoch, const std::vector<int64_t>& indices, double weight);
  bool volumes() const {
    return train_data->info().kind == SampleKind::kVolumes;
  }
  std::array<int64_t, 3> roi() const;
  ValResult validate_volumes();
  ProbeResult probe(int64_t micro_batch, int64_t segments);
  WindowResult run_window(const WindowPlan& plan, const WindowPlan* next);
  ValResult validate();
  void maybe_release_cache(bool before_validation);
  void check_replicas(const char* when, uint64_t* checksum);
  nlohmann::json window_record(const WindowResult& r) const;
  nlohmann::json plan_json() const;
  void save_checkpoint_at(
      int64_t step, int64_t epoch, int64_t samples_done, double loss_sum);
  void trim_metrics(const std::string& path) const;
  bool amp_on() const {
    return cfg.training.amp != "off";
  }
};

void Trainer::Impl::open_data() {
  OpenOptions opts;
  opts.intensity_scale = cfg.data.intensity_scale;
  opts.intensity_shift = cfg.data.intensity_shift;
  train_data.emplace(H5Dataset::open(cfg.data.train, "data.train", opts));
  const DatasetInfo& ti = train_data->info();
  if (volumes()) {
    const std::string warn =
        train_data->patch_layout_warning(cfg.data.patch_size);
    if (!warn.empty()) {
      log_event("warning: data.train: " + warn, /*echo=*/comm.rank() == 0);
    }
  }
  if (!cfg.data.val.empty()) {
    val_data.emplace(H5Dataset::open(cfg.data.val, "data.val", opts));
    const DatasetInfo& vi = val_data->info();
    // Volumes: validation volumes may have any size, not their channels.
    const bool same_shape =
        volumes() ? vi.sample_shape.at(0) == ti.sample_shape.at(0)
                  : vi.sample_shape == ti.sample_shape &&
                        vi.context_features == ti.context_features;
    MT_CHECK(
        vi.kind == ti.kind && same_shape,
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
  num_classes = std::max(ti.num_classes, cfg.model.num_classes);
  MT_CHECK(
      cfg.model.num_classes == 0 || cfg.model.num_classes >= ti.num_classes,
      "model.num_classes=",
      cfg.model.num_classes,
      " but data.train '",
      ti.path,
      "' has labels up to ",
      ti.num_classes - 1,
      " (",
      ti.num_classes,
      " classes); set model.num_classes to at least ",
      ti.num_classes,
      " or 0 (from the data)");
  check_model_fits(cfg.model.name, ti.kind, "data.train '" + ti.path + "'");
  if (volumes()) {
    MT_CHECK(
        cfg.model.in_channels == 0 ||
            cfg.model.in_channels == ti.sample_shape[0],
        "model.in_channels=",
        cfg.model.in_channels,
        " but the volumes of data.train '",
        ti.path,
        "' have ",
        ti.sample_shape[0],
        " channel(s); set it to ",
        ti.sample_shape[0],
        " or 0 (from the data)");
    // The U-Net halves the patch depth-1 times: check the training patch
    // and the validation window now, not after an epoch.
    const int64_t div = unet3d_divisor(cfg.model.depth);
    const std::array<int64_t, 3> window = roi();
    for (int i = 0; i < 3; ++i) {
      MT_CHECK(
          cfg.data.patch_size[i] % div == 0 && window[i] % div == 0,
          "data.patch_size=[",
          cfg.data.patch_size[0],
          ", ",
          cfg.data.patch_size[1],
          ", ",
          cfg.data.patch_size[2],
          "] and validation.roi=[",
          window[0],
          ", ",
          window[1],
          ", ",
          window[2],
          "] must be multiples of ",
          div,
          " on every axis: model.depth=",
          cfg.model.depth,
          " halves them ",
          cfg.model.depth - 1,
          " time(s)");
    }
    patches = std::make_unique<PatchSampler>(
        *train_data,
        cfg.data.patch_size,
        cfg.data.patches_per_volume,
        cfg.data.pos_fraction,
        static_cast<uint64_t>(cfg.data.seed),
        cfg.data.flip);
    source = std::make_unique<PatchSource>(*train_data, *patches);
  } else {
    source = std::make_unique<RowSource>(*train_data);
  }
}

std::array<int64_t, 3> Trainer::Impl::roi() const {
  std::array<int64_t, 3> r = cfg.validation.roi;
  for (int i = 0; i < 3; ++i) {
    if (r[i] == 0)
      r[i] = cfg.data.patch_size[i];
  }
  return r;
}

std::unique_ptr<torch::optim::Optimizer> Trainer::Impl::make_optimizer() {
  if (cfg.training.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params,
        torch::optim::SGDOptions(cfg.training.lr)
            .momentum(cfg.training.momentum)
            .weight_decay(cfg.training.weight_decay));
  }
  return std::make_unique<torch::optim::AdamW>(
      params,
      torch::optim::AdamWOptions(cfg.training.lr)
          .weight_decay(cfg.training.weight_decay));
}

void Trainer::Impl::build_model() {
  const DatasetInfo& ti = train_data->info();
  // Parameters, gradient buckets and (later) optimizer state are device
  // memory: create them inside the device scope.
  memory::DeviceScope device;
  std::vector<int64_t> shape = ti.sample_shape;
  if (volumes()) {  // the model sees patches
    shape = {ti.sample_shape[0]};
    shape.insert(
        shape.end(), cfg.data.patch_size.begin(), cfg.data.patch_size.end());
  }
  model =
      make_model(cfg.model, {ti.kind, shape, num_classes, ti.context_features});
  model->train();
  params = model->parameters();
  optimizer = make_optimizer();
  const int64_t world = comm.size();
  const int64_t effective = cfg.training.effective_batch_size > 0
                                ? cfg.training.effective_batch_size
                                : world *
                                      cfg.training.gradient_accumulation_steps *
                                      cfg.data.batch_size;
  sampler = std::make_unique<ShardedSampler>(
      patches ? patches->num_samples() : ti.num_samples,
      effective,
      comm.rank(),
      comm.size(),
      static_cast<uint64_t>(cfg.data.seed),
      cfg.data.drop_last);
  grad_sync = std::make_unique<GradientSync>(
      comm,
      params,
      static_cast<int64_t>(cfg.dist.bucket_mib * 1024.0 * 1024.0),
      kExtras);
  loader = std::make_unique<Prefetcher>(
      *source, cfg.data.prefetch, cfg.data.read_threads);
}

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, Options options)
    : impl_(std::make_unique<Impl>(cfg, comm, options)) {
  Impl& m = *impl_;
  m.writer = options.write_outputs && comm.rank() == 0;
  m.budget = resolve_budget(cfg.memory.budget, cfg.memory.headroom);
  // A trainer starts from an empty cache and a fresh peak, whatever ran in
  // this process before it.
  memory::release_cache();
  memory::reset_peak();
  memory::set_cap(m.budget.bytes);
  m.releases_at_start = memory::stats().cache_releases;
  m.open_data();
  try {
    m.build_model();
  } catch (const c10::OutOfMemoryError&) {
    const memory::Stats st = memory::stats();
    throw Error(detail::concat(
        "memory.budget=",
        cfg.memory.budget,
        " (",
        format_bytes(static_cast<double>(m.budget.bytes)),
        ") is too small for the model itself: its parameters and gradient "
        "buckets need more than that (",
        format_bytes(double(st.reserved)),
        " allocated when it ran out); raise memory.budget or use a smaller "
        "model"));
  }
  m.scaler = std::make_unique<LossScaler>(
      cfg.training.amp == "fp16",
      cfg.training.amp_init_scale,
      cfg.training.amp_growth_interval);
  m.leak = std::make_unique<memory::LeakDetector>(
      cfg.memory.leak_warn_mib * 1024.0 * 1024.0, cfg.memory.leak_epochs);
  if (m.writer)
    make_directories(cfg.output.dir);
  // metrics.jsonl is opened by run(): a refused resume must not touch it.
  m.metrics = std::make_unique<MetricsLog>("");
  m.progress = std::make_unique<Progress>(
      comm.rank() == 0 ? options.progress : nullptr,
      options.progress_is_tty,
      cfg.output.progress_every_s);
}

Trainer::~Trainer() = default;

Batch Trainer::Impl::to_device(Batch b) const {
  // On a GPU this is the host-to-device copy (from page-locked buffers,
  // non-blocking); on the CPU build the copy is what makes the batch count
  // in the device domain, as it would on a GPU.
  Batch d{b.x.clone(), b.y.clone(), {}};
  if (b.context.defined())
    d.context = b.context.clone();
  return d;
}

// Reads on the host (host memory domain; usually already read ahead by the
// prefetcher), copies to the device and gives the host buffers back.
Batch Trainer::Impl::load(
    Prefetcher& from, int64_t epoch, const std::vector<int64_t>& ids) const {
  Batch host;
  {
    memory::HostScope host_scope;
    host = from.load(epoch, ids);
  }
  Batch device = to_device(host);
  from.recycle(std::move(host));
  return device;
}

// The model under autocast (training.amp); float32 logits.
torch::Tensor Trainer::Impl::forward(
    const torch::Tensor& x, const torch::Tensor& context) {
  compat::AutocastGuard amp(
      amp_on(),
      /*cuda=*/false,
      cfg.training.amp == "bf16" ? torch::kBFloat16 : torch::kHalf);
  const torch::Tensor logits =
      context.defined() ? model->forward(x, context) : model->forward(x);
  return logits.to(torch::kFloat32);
}

// Sum over the batch's samples of the per-sample loss: cross-entropy for
// classifiers, Dice + cross-entropy per volume patch for segmentation (a
// per-sample Dice, so that Note [Window weighting] holds).
torch::Tensor Trainer::Impl::loss_sum(
    const torch::Tensor& logits, const torch::Tensor& y) const {
  if (volumes())
    return dice_ce_loss_sum(logits, y);
  return torch::nn::functional::cross_entropy(
      logits,
      y,
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

// One micro-step: read, forward (under autocast), backward of the weighted,
// scaled loss. Returns the unweighted loss sum. Everything it creates (batch,
// context features, logits, loss, graph) is freed when it returns; the
// context tensors as soon as the forward has used them (the graph keeps
// what backward needs).
double Trainer::Impl::micro_step(
    int64_t epoch, const std::vector<int64_t>& indices, double weight) {
  Batch batch = load(*loader, epoch, indices);
  const torch::Tensor logits = forward(batch.x, batch.context);
  batch.context.reset();
  batch.x.reset();
  torch::Tensor loss = loss_sum(logits, batch.y);
  // See Note [Window weighting].
  (loss * (weight * scaler->scale())).backward();
  return loss.item<double>();
}

ProbeResult Trainer::Impl::probe(int64_t micro_batch, int64_t segments) {
  // Probe against the usable budget, on the same samples on every rank, then
  // put everything back as it was.
  const int64_t usable = budget.usable();
  std::vector<at::Tensor> saved;
  {
    memory::HostScope host;
    torch::NoGradGuard no_grad;
    for (const auto& p : params)
      saved.push_back(p.detach().clone());
  }
  std::vector<int64_t> indices(micro_batch);
  for (int64_t i = 0; i < micro_batch; ++i) {
    indices[i] = i % sampler->num_samples();
  }
  model->set_checkpointed(segments);
  memory::set_cap(usable);
  memory::release_cache();
  memory::reset_peak();
  bool ran = true;
  {
    memory::DeviceScope device;
    auto opt = make_optimizer();
    try {
      // Two steps: the second runs with the optimizer state the first
      // created, which is what every later window looks like.
      for (int step = 0; step < 2; ++step) {
        grad_sync->attach();
        micro_step(0, indices, 1.0 / static_cast<double>(micro_batch));
        opt->step();
      }
    } catch (const c10::OutOfMemoryError&) {
      ran = false;
    }
    compat::zero_grad_to_none(*opt);
  }
  const int64_t peak = memory::stats().peak_reserved;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i)
      params[i].copy_(saved[i]);
  }
  memory::release_cache();
  memory::set_cap(budget.bytes);
  return {ran && (usable <= 0 || peak <= usable), peak};
}

void Trainer::prepare() {
  Impl& m = *impl_;
  if (m.prepared)
    return;
  const Budget& b = m.budget;
  PlanRequest req;
  req.rank_share = m.sampler->max_rank_share();
  // kAuto (0) means search; a fixed micro-batch larger than the rank's share
  // of a window is the share (a micro-batch never spans windows).
  req.fixed_micro = m.cfg.data.batch_size == kAuto
                        ? kAuto
                        : std::min(m.cfg.data.batch_size, req.rank_share);
  req.checkpointing = m.cfg.training.gradient_checkpointing;
  req.num_segments = m.model->num_segments();

  // Plan locally (every rank probes the same samples), then agree: the
  // smallest micro-batch and the most checkpointing any rank needs.
  std::string error;
  // Probes run forward passes, which draw from the RNG (dropout): put it
  // back, so that planning does not change what training computes.
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor rng_state;
  {
    memory::HostScope host;
    rng_state = gen.get_state();
  }
  try {
    if (b.limited()) {
      m.plan = plan_memory(req, [&](int64_t micro, int64_t segments) {
        return m.probe(micro, segments);
      });
    } else {
      m.plan.micro_batch = req.fixed_micro;
      m.plan.checkpointed_segments =
          req.checkpointing == "all" ? req.num_segments : 0;
      m.plan.accumulation_steps =
          (req.rank_share + req.fixed_micro - 1) / req.fixed_micro;
      m.plan.note =
          req.checkpointing == "auto"
              ? "no memory.budget: checkpointing auto checkpoints nothing"
              : "no memory.budget: nothing measured";
    }
  } catch (const Error& e) {
    error = e.what();
  }
  gen.set_state(rng_state);
  m.loader->take_wait_seconds();  // probe reads are not window data waits
  if (!all_ranks_ok(m.comm, error.empty())) {
    if (error.empty())
      throw PeerError("memory planning failed on another rank");
    throw Error(error);
  }
  auto agreed = torch::tensor(
      {-m.plan.micro_batch, m.plan.checkpointed_segments}, torch::kInt64);
  m.comm.all_reduce(agreed, ReduceOp::kMax);
  m.plan.micro_batch = -agreed[0].item<int64_t>();
  m.plan.checkpointed_segments = agreed[1].item<int64_t>();
  m.plan.accumulation_steps =
      (req.rank_share + m.plan.micro_batch - 1) / m.plan.micro_batch;
  m.model->set_checkpointed(m.plan.checkpointed_segments);
  m.micro = m.plan.micro_batch;
  m.val_micro = m.cfg.data.val_batch_size > 0 ? m.cfg.data.val_batch_size
                                              : m.plan.micro_batch;
  // Releases from here on are the run's own (the probes released too).
  m.releases_at_start = memory::stats().cache_releases;
  m.prepared = true;
}

nlohmann::json Trainer::Impl::plan_json() const {
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : plan.probes) {
    probes.push_back(
        {{"micro_batch", p.micro},
         {"checkpointed_segments", p.segments},
         {"fits", p.fits},
         {"peak_bytes", p.peak}});
  }
  std::vector<std::string> segments(
      model->segment_names().begin(),
      model->segment_names().begin() + plan.checkpointed_segments);
  nlohmann::json j = {
      {"budget", budget.spec},
      {"budget_bytes", budget.bytes},
      {"headroom", budget.headroom},
      {"usable_bytes", budget.limited() ? budget.usable() : 0},
      {"world_size", comm.size()},
      {"effective_batch", sampler->effective_batch()},
      {"micro_batch", plan.micro_batch},
      {"accumulation_steps", plan.accumulation_steps},
      {"gradient_checkpointing", cfg.training.gradient_checkpointing},
      {"checkpointed_segments", segments},
      {"amp", cfg.training.amp},
      {"predicted_peak_bytes", plan.predicted_peak},
      {"measured_peak_bytes", measured_peak},
      {"note", plan.note},
      {"probes", probes}};
  return j;
}

WindowResult Trainer::Impl::run_window(
    const WindowPlan& wp, const WindowPlan* next) {
  const auto start = Clock::now();
  const CommStats before = comm.stats();
  WindowResult r;
  r.epoch = wp.epoch;
  r.window = wp.window;
  r.samples = wp.global_samples;
  monitor.begin_window();

  // 1. Micro-steps: forward and backward on this rank's micro-batches,
  //    gradients accumulating locally. No communication here.
  //    See Note [All-reduce only at the accumulation boundary] and
  //    Note [OOM recovery].
  const double weight = 1.0 / static_cast<double>(wp.global_samples);
  double loss_sum = 0.0;
  for (;;) {
    loss_sum = 0.0;
    r.micro_steps = 0;
    r.micro_step_start_bytes.clear();
    grad_sync->attach();
    const auto batches = split_micro_batches(wp.rank_indices, micro);
    loader->expect(wp.epoch, batches);
    try {
      for (const auto& indices : batches) {
        r.micro_step_start_bytes.push_back(memory::stats().allocated);
        loss_sum += micro_step(wp.epoch, indices, weight);
        ++r.micro_steps;
      }
      // Read the next window while this one's gradient is all-reduced.
      if (next)
        loader->expect_more(
            next->epoch, split_micro_batches(next->rank_indices, micro));
      break;
    } catch (const c10::OutOfMemoryError&) {
      compat::zero_grad_to_none(*optimizer);
      memory::release_cache();
      ++r.oom_retries;
      const memory::Stats s = memory::stats();
      MT_CHECK(
          micro > 1 && r.oom_retries <= cfg.memory.max_oom_retries,
          "out of device memory: the window does not fit memory.budget=",
          budget.spec,
          " (",
          format_bytes(static_cast<double>(budget.bytes)),
          ") even at micro-batch ",
          micro,
          " after ",
          r.oom_retries - 1,
          " retries (memory.max_oom_retries=",
          cfg.memory.max_oom_retries,
          "); measured peak ",
          format_bytes(static_cast<double>(s.peak_reserved)),
          ". Raise memory.budget, set training.gradient_checkpointing=all or "
          "training.amp=bf16, or use a smaller model");
      // Halve the micro-batch actually in use (one larger than this window's
      // share is the share), so that every replay changes the split.
      const int64_t in_use = std::min<int64_t>(
          micro, std::max<int64_t>(1, wp.rank_indices.size()));
      const int64_t smaller = std::max<int64_t>(1, in_use / 2);
      log_event(
          detail::concat(
              "[rank ",
              comm.rank(),
              "] out of device memory at micro-batch ",
              micro,
              " (epoch ",
              wp.epoch + 1,
              ", window ",
              wp.window + 1,
              "); replaying the window at micro-batch ",
              smaller),
          /*echo=*/true);
      micro = smaller;
    }
  }

  // 2. Boundary: one bucketed all-reduce of gradient + [loss sum, samples].
  std::vector<float> extras = {
      static_cast<float>(loss_sum),
      static_cast<float>(wp.rank_indices.size()),
      stop_signal() != 0 ? 1.0f : 0.0f};
  grad_sync->sync(extras);
  r.stop_requested = extras[2] > 0;  // the same verdict on every rank
  r.loss = extras[0] / extras[1];
  MT_INTERNAL_ASSERT(
      static_cast<int64_t>(extras[1]) == wp.global_samples,
      "ranks disagree on the window's samples");

  // 3. Update, unless a loss or gradient is inf/NaN (fp16: the scaler's
  //    check), then drop the gradients.
  r.loss_scale = scaler->scale();
  const bool finite = scaler->enabled()
                          ? scaler->unscale_and_check(params)
                          : std::isfinite(extras[0]) && grad_sync->all_finite();
  if (finite) {
    if (cfg.training.grad_clip_norm > 0) {
      torch::nn::utils::clip_grad_norm_(params, cfg.training.grad_clip_norm);
    }
    optimizer->step();
  }
  r.skipped = !finite;
  scaler->update(finite);
  nonfinite_in_a_row = finite ? 0 : nonfinite_in_a_row + 1;
  if (!finite) {
    log_event(detail::concat(
        "non-finite loss or gradient in epoch ",
        wp.epoch + 1,
        ", window ",
        wp.window + 1,
        ": update skipped"));
  }
  if (!scaler->enabled() && !finite) {
    ++nonfinite_skips;
    MT_CHECK(
        cfg.training.nonfinite == "skip" &&
            nonfinite_in_a_row <= cfg.training.max_nonfinite_skips,
        "non-finite loss or gradient (NaN/Inf) in epoch ",
        wp.epoch + 1,
        ", window ",
        wp.window + 1,
        " (",
        nonfinite_in_a_row,
        " window(s) in a row; training.nonfinite=",
        cfg.training.nonfinite,
        ", max_nonfinite_skips=",
        cfg.training.max_nonfinite_skips,
        "). The parameters were not updated; the last checkpoint in ",
        cfg.output.dir,
        "/checkpoints is the resume point. Check the data "
        "for NaN/Inf values and the learning rate.");
  }
  compat::zero_grad_to_none(*optimizer);

  if (cfg.memory.test_leak_kib_per_window > 0) {
    test_leak.push_back(
        torch::empty({cfg.memory.test_leak_kib_per_window * 256}));
  }
  maybe_release_cache(/*before_validation=*/false);
  const memory::WindowMemory mem = monitor.end_window();
  r.mem_allocated = mem.allocated;
  r.mem_reserved = mem.reserved;
  r.mem_peak = mem.peak;
  r.mem_peak_reserved = mem.peak_reserved;
  measured_peak = std::max(measured_peak, mem.peak_reserved);
  r.micro_batch = micro;
  r.cache_releases = memory::stats().cache_releases - releases_at_start;
  r.allreduce_calls = comm.stats().allreduce_calls - before.allreduce_calls;
  r.allreduce_bytes = comm.stats().allreduce_bytes - before.allreduce_bytes;
  r.data_wait_s = loader->take_wait_seconds();
  r.seconds = seconds_since(start);
  return r;
}

// Note [Cache policy]
// Cached blocks are what makes the next window's allocations cheap, and
// releasing them synchronises a CUDA device: so no unconditional
// empty_cache() in the loop. With memory.release_cache=auto they are
// released only when the cached bytes (reserved - allocated) pass
// memory.release_threshold x the budget, and before validation (which
// allocates differently shaped tensors). Count and time are recorded.
void Trainer::Impl::maybe_release_cache(bool before_validation) {
  if (cfg.memory.release_cache != "auto")
    return;
  const memory::Stats s = memory::stats();
  const bool over =
      budget.limited() &&
      static_cast<double>(s.reserved - s.allocated) >
          cfg.memory.release_threshold * static_cast<double>(budget.bytes);
  if (before_validation || over)
    memory::release_cache();
}

ValResult Trainer::Impl::validate_volumes() {
  torch::NoGradGuard no_grad;
  model->eval();
  Validator validator(*val_data, cfg.validation, roi(), num_classes, comm);
  const VolumeValResult v = validator.run([this](const at::Tensor& windows) {
    return forward(windows, at::Tensor());
  });
  model->train();
  ValResult r;
  r.loss = v.loss;
  r.samples = v.volumes;
  r.oom_retries = v.oom_retries;
  r.batch = v.sw_batch;
  r.dice = v.dice;
  r.dice_per_class = v.dice_per_class;
  return r;
}

ValResult Trainer::Impl::validate() {
  if (volumes())
    return validate_volumes();
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t n = val_data->info().num_samples;
  const int64_t begin = n * comm.rank() / comm.size();
  const int64_t end = n * (comm.rank() + 1) / comm.size();
  const RowSource val_source(*val_data);
  Prefetcher val_loader(val_source, /*depth=*/0, /*threads=*/0);
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t retries = 0;
  for (int64_t s = begin; s < end;) {
    std::vector<int64_t> idx;
    for (int64_t i = s; i < std::min(end, s + val_micro); ++i) {
      idx.push_back(i);
    }
    try {
      const Batch b = load(val_loader, 0, idx);
      const torch::Tensor logits = forward(b.x, b.context);
      const double batch_loss =
          torch::nn::functional::cross_entropy(
              logits,
              b.y,
              torch::nn::functional::CrossEntropyFuncOptions().reduction(
                  torch::kSum))
              .item<double>();
      const int64_t batch_correct =
          logits.argmax(1).eq(b.y).sum().item<int64_t>();
      // Counted only once the whole batch succeeded: a retry after an OOM
      // must not count it twice.
      loss_sum += batch_loss;
      correct += batch_correct;
      s += static_cast<int64_t>(idx.size());
    } catch (const c10::OutOfMemoryError&) {
      memory::release_cache();
      MT_CHECK(
          val_micro > 1,
          "out of device memory in validation even at "
          "batch 1 within memory.budget=",
          budget.spec);
      val_micro = std::max<int64_t>(1, val_micro / 2);
      ++retries;
      log_event(
          detail::concat(
              "[rank ",
              comm.rank(),
              "] out of device memory in validation; "
              "validation batch now ",
              val_micro),
          /*echo=*/true);
    }
  }
  model->train();
  auto totals = torch::tensor(
      {loss_sum,
       static_cast<double>(correct),
       static_cast<double>(end - begin)},
      torch::kFloat64);
  comm.all_reduce_sum(totals);
  const double count = totals[2].item<double>();
  ValResult r;
  r.loss = totals[0].item<double>() / count;
  r.accuracy = totals[1].item<double>() / count;
  r.samples = static_cast<int64_t>(count);
  r.oom_retries = retries;
  r.batch = val_micro;
  return r;
}

void Trainer::Impl::check_replicas(const char* when, uint64_t* checksum) {
  if (!replicas_identical(comm, params, checksum)) {
    throw InternalError(
        std::string("replica check failed ") + when +
        ": this rank's parameters (checksum " + hex(*checksum) +
        ") differ from rank 0's. Likely causes: ranks run "
        "different memtrain or LibTorch builds, "
        "non-deterministic kernels, or a memory error.");
  }
}

nlohmann::json Trainer::Impl::window_record(const WindowResult& r) const {
  const memory::Stats s = memory::stats();
  nlohmann::json j = {
      {"type", "window"},
      {"epoch", r.epoch},
      {"window", r.window},
      {"step", r.step},
      {"loss", r.loss},
      {"lr", cfg.training.lr},
      {"micro_batch", r.micro_batch},
      {"accum_steps", r.micro_steps},
      {"effective_batch", sampler->effective_batch()},
      {"samples", r.samples},
      {"samples_per_s", r.samples / std::max(r.seconds, 1e-9)},
      {"allreduce_calls", r.allreduce_calls},
      {"allreduce_bytes", r.allreduce_bytes},
      {"data_wait_s", r.data_wait_s},
      {"window_s", r.seconds},
      {"mem_allocated", r.mem_allocated},
      {"mem_reserved", r.mem_reserved},
      {"mem_peak", r.mem_peak},
      {"mem_peak_reserved", r.mem_peak_reserved},
      {"oom_retries", r.oom_retries},
      {"cache_releases", r.cache_releases},
      {"cache_release_s", s.cache_release_seconds}};
  j["skipped_steps"] =
      scaler->enabled() ? scaler->skipped_steps() : nonfinite_skips;
  if (scaler->enabled())
    j["loss_scale"] = r.loss_scale;
  return j;
}

void Trainer::Impl::save_checkpoint_at(
    int64_t step, int64_t epoch, int64_t samples_done, double loss_sum) {
  const auto start = Clock::now();
  memory::HostScope host;  // checkpoint buffers are host memory
  // Every rank's RNG state travels to rank 0 (one all-reduce of a
  // [world, state] table in which each rank fills its own row).
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const torch::Tensor mine = gen.get_state();
  auto table = torch::zeros({comm.size(), mine.numel()}, torch::kInt32);
  table[comm.rank()].copy_(mine.to(torch::kInt32));
  comm.all_reduce_sum(table);
  if (!writer)
    return;
  Checkpoint c;
  CheckpointState& st = c.state;
  st.step = step;
  st.epoch = epoch;
  st.epoch_samples = samples_done;
  st.epoch_loss_sum = loss_sum;
  st.world_size = comm.size();
  st.effective_batch = sampler->effective_batch();
  st.model = cfg.model.name;
  st.config_yaml = cfg.to_yaml();
  st.loss_scale = scaler->scale();
  st.scaler_good_steps = scaler->good_steps();
  st.scaler_skipped =
      scaler->enabled() ? scaler->skipped_steps() : nonfinite_skips;
  st.nonfinite_in_a_row = nonfinite_in_a_row;
  for (const auto& item : model->named_parameters()) {
    c.params.emplace_back(item.key(), item.value().detach());
  }
  torch::serialize::OutputArchive archive;
  optimizer->save(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  c.optimizer = bytes.str();
  for (int r = 0; r < comm.size(); ++r) {
    c.rng.push_back(table[r].to(torch::kUInt8));
  }
  make_directories(cfg.output.dir + "/checkpoints");
  const std::string path = checkpoint_path(cfg.output.dir, step);
  save_checkpoint(path, c);
  prune_checkpoints(cfg.output.dir, cfg.training.keep_checkpoints, step);
  log_event("checkpoint written: " + path);
  metrics->write(
      {{"type", "checkpoint"},
       {"step", step},
       {"epoch", epoch},
       {"path", path},
       {"seconds", seconds_since(start)}});
}

// A resumed run's metrics.jsonl reads as one run: the records the
// checkpoint's step covers are kept, later ones (windows run after the
// checkpoint by the run that stopped) are dropped.
void Trainer::Impl::trim_metrics(const std::string& path) const {
  std::ifstream in(path);
  if (!in.good())
    return;
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty())
      continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception&) {
      continue;  // a line cut short by a crash
    }
    const std::string type = j.value("type", "");
    const bool keep = type == "window" || type == "checkpoint"
                          ? j.value("step", int64_t{0}) <= start_step
                          : j.value("epoch", int64_t{0}) < start_epoch;
    if (keep)
      kept += line + "\n";
  }
  write_file_atomically(path, kept);
}

std::string Trainer::resume(const std::string& spec) {
  Impl& m = *impl_;
  std::vector<std::string> candidates;
  const bool automatic = spec == "auto";
  struct stat st {};
  const bool folder =
      automatic || (::stat(spec.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
  if (folder) {
    const std::string dir = automatic ? m.cfg.output.dir : spec;
    candidates = list_checkpoints(dir);
    if (candidates.empty()) {
      MT_CHECK(
          automatic,
          "--resume ",
          spec,
          ": no checkpoint (ckpt-*.safetensors) in that folder");
      return "--resume auto: no checkpoint in " + dir +
             "/checkpoints; starting from the beginning";
    }
  } else {
    MT_CHECK(
        ::stat(spec.c_str(), &st) == 0,
        "--resume ",
        spec,
        ": no such file or folder (give a checkpoint file, a folder "
        "holding checkpoints, or auto)");
    candidates = {spec};
  }
  std::optional<Checkpoint> ck;
  std::string skipped;
  for (const auto& path : candidates) {
    try {
      ck = load_checkpoint(path);
      break;
    } catch (const Error& e) {
      if (!folder)
        throw;
      skipped += std::string(skipped.empty() ? "" : "; ") + e.what();
    }
  }
  MT_CHECK(
      ck.has_value(), "--resume ", spec, ": no valid checkpoint: ", skipped);
  const CheckpointState& s = ck->state;
  const std::string& path = ck->path;
  MT_CHECK(
      s.model == m.cfg.model.name,
      "checkpoint '",
      path,
      "' is from model '",
      s.model,
      "' but model.name is '",
      m.cfg.model.name,
      "'; resume with the model it was trained with");
  const NamedTensors mine = named_parameters();
  MT_CHECK(
      mine.size() == ck->params.size(),
      "checkpoint '",
      path,
      "' has ",
      ck->params.size(),
      " parameter tensors, this model has ",
      mine.size(),
      " (model.depth or another shape key differs?)");
  for (size_t i = 0; i < mine.size(); ++i) {
    MT_CHECK(
        mine[i].first == ck->params[i].first &&
            mine[i].second.sizes() == ck->params[i].second.sizes(),
        "checkpoint '",
        path,
        "' holds '",
        ck->params[i].first,
        "' ",
        ck->params[i].second.sizes(),
        " where this model has '",
        mine[i].first,
        "' ",
        mine[i].second.sizes(),
        " (model.hidden, model.depth or the data's shape differs)");
  }
  const int64_t batch = m.sampler->effective_batch();
  MT_CHECK(
      s.epoch_samples % batch == 0,
      "checkpoint '",
      path,
      "' stopped after ",
      s.epoch_samples,
      " samples of epoch ",
      s.epoch + 1,
      ", not a window boundary of this run's effective "
      "batch ",
      batch,
      "; set training.effective_batch_size=",
      s.effective_batch,
      " (the checkpoint's)");
  {
    memory::DeviceScope device;  // optimizer state is device memory
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < mine.size(); ++i) {
      m.params[i].copy_(ck->params[i].second);
    }
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(ck->optimizer.data(), ck->optimizer.size());
      m.optimizer->load(archive);
    } catch (const c10::Error& e) {
      throw Error(
          "checkpoint '" + path +
          "': its optimizer state does not fit training.optimizer=" +
          m.cfg.training.optimizer + " (" + e.what_without_backtrace() + ")");
    }
  }
  m.scaler->restore(s.loss_scale, s.scaler_good_steps, s.scaler_skipped);
  if (!m.scaler->enabled())
    m.nonfinite_skips = s.scaler_skipped;
  m.nonfinite_in_a_row = s.nonfinite_in_a_row;
  std::string note;
  if (s.world_size == m.comm.size() &&
      static_cast<int64_t>(ck->rng.size()) == s.world_size) {
    at::Generator gen = at::detail::getDefaultCPUGenerator();
    gen.set_state(ck->rng[m.comm.rank()]);
  } else {
    note = " (written by " + std::to_string(s.world_size) +
           " ranks: random states not restored)";
  }
  m.resumed = true;
  m.start_step = s.step;
  m.start_epoch = s.epoch;
  m.start_window = s.epoch_samples / batch;
  m.start_epoch_loss = s.epoch_loss_sum;
  return "resumed from " + path + " at step " + std::to_string(s.step) +
         ", epoch " + std::to_string(s.epoch + 1) + ", window " +
         std::to_string(m.start_window + 1) + note +
         (skipped.empty() ? "" : "; skipped: " + skipped);
}

TrainSummary Trainer::run() {
  Impl& m = *impl_;
  prepare();
  TrainSummary summary;
  // Everything from here on that is not explicitly host memory is device
  // memory: activations, gradients, optimizer state, batches.
  memory::DeviceScope device;
  // Every rank must continue from the same position: each resumed by
  // itself (from a shared output.dir), so check that they agree.
  {
    auto pos = torch::tensor(
        {m.start_step, -m.start_step, m.start_window, -m.start_window},
        torch::kInt64);
    m.comm.all_reduce(pos, ReduceOp::kMax);
    MT_CHECK(
        pos[0].item<int64_t>() == -pos[1].item<int64_t>() &&
            pos[2].item<int64_t>() == -pos[3].item<int64_t>(),
        "ranks resumed from different checkpoints (steps ",
        -pos[1].item<int64_t>(),
        " to ",
        pos[0].item<int64_t>(),
        "): every rank must see the same output.dir/checkpoints; pass one "
        "checkpoint file to --resume");
  }
  // Start every replica from rank 0's parameters (they are equal by seed;
  // this makes it so whatever the nodes' LibTorch builds draw).
  {
    torch::NoGradGuard no_grad;
    for (auto& p : m.params)
      m.comm.broadcast(p, 0);
  }
  if (m.writer) {
    write_file_atomically(
        m.cfg.output.dir + "/config.resolved.yaml", m.cfg.to_yaml());
    write_file_atomically(
        m.cfg.output.dir + "/memory_plan.json", m.plan_json().dump(2) + "\n");
    const std::string path = m.cfg.output.dir + "/metrics.jsonl";
    if (m.resumed)
      m.trim_metrics(path);
    m.metrics = std::make_unique<MetricsLog>(path, /*append=*/m.resumed);
  }
  const int64_t epochs = m.cfg.training.epochs;
  const int64_t wpe = m.sampler->windows_per_epoch();
  int64_t total = epochs * wpe;
  if (m.cfg.training.max_windows > 0) {
    total = std::min(total, m.cfg.training.max_windows);
  }
  const bool check_each_window = m.cfg.dist.check_replicas == "window";
  const bool check_each_epoch = m.cfg.dist.check_replicas != "off";
  bool checked_last = false;

  const int64_t batch = m.sampler->effective_batch();
  const int64_t every = m.cfg.training.checkpoint_every;
  int64_t step = m.start_step;  // windows done, this run and before it
  for (int64_t epoch = m.start_epoch; epoch < epochs && step < total; ++epoch) {
    const auto epoch_start = Clock::now();
    m.monitor.begin_epoch();
    // A resumed epoch carries on with the loss of its windows before the
    // checkpoint, so its record is the uninterrupted run's.
    const bool resumed_epoch = m.resumed && epoch == m.start_epoch;
    double epoch_loss = resumed_epoch ? m.start_epoch_loss : 0.0;
    int64_t epoch_samples = resumed_epoch ? m.start_window * batch : 0;
    int64_t epoch_ooms = 0;
    int64_t w = resumed_epoch ? m.start_window : 0;
    std::optional<WindowPlan> next;  // planned with the window before
    for (; w < wpe && step < total; ++w) {
      const WindowPlan plan =
          next ? std::move(*next) : m.sampler->plan(epoch, w);
      // The next window of this epoch, for the prefetcher.
      next.reset();
      if (w + 1 < wpe && step + 1 < total)
        next = m.sampler->plan(epoch, w + 1);
      WindowResult r = m.run_window(plan, next ? &*next : nullptr);
      r.step = ++step;
      ++summary.windows;
      summary.oom_retries += r.oom_retries;
      epoch_ooms += r.oom_retries;
      summary.skipped_steps += r.skipped ? 1 : 0;
      epoch_loss += r.loss * r.samples;
      epoch_samples += r.samples;
      m.metrics->write(m.window_record(r));
      m.progress->window(
          epoch,
          epochs,
          w,
          wpe,
          r.loss,
          r.samples / std::max(r.seconds, 1e-9),
          summary.windows,
          total - m.start_step);
      summary.window_results.push_back(std::move(r));
      checked_last = false;
      if (check_each_window) {
        m.check_replicas("after a window", &summary.checksum);
        checked_last = true;
      }
      // At the accumulation boundary, between windows of the epoch; the
      // epoch's last window is followed by the epoch-end checkpoint.
      if (summary.window_results.back().stop_requested) {
        // Every rank saw the request in the same all-reduce: checkpoint
        // and stop. On the epoch's last window the epoch's end (record,
        // validation, checks, its checkpoint) comes first. See
        // stop_request.h.
        summary.stopped = true;
        if (w + 1 < wpe) {
          ++w;
          break;
        }
      }
      if (every > 0 && step % every == 0 && w + 1 < wpe && step < total)
        m.save_checkpoint_at(step, epoch, (w + 1) * batch, epoch_loss);
    }
    if (w < wpe) {  // stopped inside the epoch
      m.save_checkpoint_at(step, epoch, w * batch, epoch_loss);
      m.progress->line(
          summary.stopped
              ? "stop requested (SIGTERM, SIGUSR1 or SIGINT on a rank): "
                "checkpoint written at step " +
                    std::to_string(step)
              : "stopped after training.max_windows=" +
                    std::to_string(m.cfg.training.max_windows) +
                    " windows; checkpoint written");
      break;
    }

    // The leak check reads the bytes held at the same point of every epoch:
    // after its last window, before validation.
    const memory::Stats held = memory::stats();
    const auto leak = m.leak->observe(epoch, held.allocated);
    nlohmann::json rec = {
        {"type", "epoch"},
        {"epoch", epoch},
        {"windows", wpe},
        {"train_loss", epoch_loss / epoch_samples},
        {"mem_held", held.allocated},
        {"oom_retries", epoch_ooms}};
    std::ostringstream line;
    line << "epoch " << epoch + 1 << "/" << epochs << " done: train loss "
         << epoch_loss / epoch_samples;
    const bool validate_now =
        m.val_data && ((epoch + 1) % m.cfg.validation.every_epochs == 0 ||
                       epoch + 1 == epochs);
    if (validate_now) {
      const auto val_start = Clock::now();
      m.maybe_release_cache(/*before_validation=*/true);
      memory::reset_peak();
      ValResult v = m.validate();
      m.monitor.note_peak();
      v.epoch = epoch;
      v.device_peak = memory::stats().peak_allocated;
      v.seconds = seconds_since(val_start);
      summary.validations.push_back(v);
      rec["val_loss"] = v.loss;
      rec["val_samples"] = v.samples;
      rec["val_device_peak"] = v.device_peak;
      rec["val_oom_retries"] = v.oom_retries;
      rec["val_batch"] = v.batch;
      rec["val_seconds"] = v.seconds;
      nlohmann::json vrec = {
          {"type", "validation"},
          {"epoch", epoch},
          {"val_loss", v.loss},
          {"val_device_peak", v.device_peak},
          {"val_seconds", v.seconds}};
      line << ", val loss " << v.loss;
      if (m.volumes()) {
        // NaN (a class in no volume) is written as null.
        auto num = [](double d) {
          return std::isnan(d) ? nlohmann::json(nullptr) : nlohmann::json(d);
        };
        nlohmann::json per_class = nlohmann::json::array();
        for (double d : v.dice_per_class)
          per_class.push_back(num(d));
        rec["val_dice"] = num(v.dice);
        vrec["val_dice"] = num(v.dice);
        vrec["val_dice_per_class"] = per_class;
        vrec["val_volumes"] = v.samples;
        vrec["val_sw_batch"] = v.batch;
        vrec["val_offload"] = m.cfg.validation.offload;
        line << ", val Dice " << v.dice;
      } else {
        rec["val_accuracy"] = v.accuracy;
        vrec["val_accuracy"] = v.accuracy;
        vrec["val_samples"] = v.samples;
        line << ", val accuracy " << v.accuracy;
      }
      vrec["val_oom_retries"] = v.oom_retries;
      m.metrics->write(vrec);
    }
    if (check_each_epoch && !checked_last) {
      m.check_replicas("at the end of an epoch", &summary.checksum);
      checked_last = true;
    }
    if (check_each_epoch) {
      rec["param_checksum"] = hex(summary.checksum);
      rec["replicas_identical"] = true;
    }
    const memory::Stats s = memory::stats();
    rec["mem_peak"] = m.monitor.epoch_peak();
    rec["mem_reserved"] = s.reserved;
    rec["cache_releases"] = s.cache_releases - m.releases_at_start;
    rec["epoch_s"] = seconds_since(epoch_start);
    line << " (" << format_duration(seconds_since(epoch_start)) << ")";
    m.metrics->write(rec);
    m.progress->line(line.str());
    m.save_checkpoint_at(step, epoch + 1, 0, 0.0);
    if (summary.stopped) {
      m.progress->line(
          "stop requested (SIGTERM, SIGUSR1 or SIGINT on a rank): checkpoint "
          "written at step " +
          std::to_string(step));
      break;
    }
    if (memory::accounting_installed()) {
      std::ostringstream mem;
      mem << "  memory: peak " << format_bytes(double(m.monitor.epoch_peak()));
      if (m.budget.limited()) {
        mem << " of budget " << format_bytes(double(m.budget.bytes)) << " ("
            << std::llround(
                   100.0 * double(m.monitor.epoch_peak()) /
                   double(m.budget.bytes))
            << "%)";
      }
      mem << ", held " << format_bytes(double(held.allocated))
          << " at epoch end, reserved " << format_bytes(double(s.reserved))
          << ", OOM retries " << epoch_ooms << ", cache releases "
          << s.cache_releases - m.releases_at_start;
      m.progress->line(mem.str());
    }
    if (leak) {
      summary.leak_warnings.push_back(*leak);
      nlohmann::json warn = {
          {"type", "warning"}, {"epoch", epoch}, {"leak_warning", *leak}};
      m.metrics->write(warn);
      m.progress->line("warning: " + *leak);
    }
  }
  if (check_each_epoch && !checked_last) {
    m.check_replicas("at the end of training", &summary.checksum);
  } else if (!check_each_epoch) {
    summary.checksum = parameter_checksum(m.params);
  }
  if (m.writer) {
    save_safetensors(
        m.cfg.output.dir + "/model.safetensors",
        named_parameters(),
        {{"format", "pt"},
         {"producer", "memtrain"},
         {"model", m.cfg.model.name},
         {"windows", std::to_string(step)}});
    write_file_atomically(
        m.cfg.output.dir + "/memory_plan.json", m.plan_json().dump(2) + "\n");
  }
  // No rank returns (and maybe exits) before rank 0 has written the model.
  m.comm.barrier();
  return summary;
}

std::string Trainer::describe() const {
  const Impl& m = *impl_;
  const DatasetInfo& ti = m.train_data->info();
  std::ostringstream out;
  auto shape = [](const std::vector<int64_t>& s) {
    std::string t = "[";
    for (size_t i = 0; i < s.size(); ++i) {
      t += (i ? "," : "") + std::to_string(s[i]);
    }
    return t + "]";
  };
  out << "data: train '" << ti.path << "' " << ti.num_samples << " x "
      << to_string(ti.kind) << " " << shape(ti.sample_shape) << " "
      << ti.sample_dtype << ", " << ti.num_classes << " classes";
  if (ti.context_features > 0)
    out << ", context features " << ti.context_features;
  if (m.patches) {
    const auto& p = m.cfg.data.patch_size;
    out << "; patches " << p[0] << "x" << p[1] << "x" << p[2] << ", "
        << m.cfg.data.patches_per_volume << " per volume, flip "
        << m.cfg.data.flip << ", pos_fraction " << m.cfg.data.pos_fraction;
  }
  out << "; prefetch " << m.cfg.data.prefetch << " batches on "
      << (m.cfg.data.prefetch > 0 ? m.cfg.data.read_threads : 0)
      << " reader thread(s)";
  if (m.val_data) {
    out << "; val '" << m.val_data->info().path << "' "
        << m.val_data->info().num_samples;
    if (m.patches) {
      const auto r = m.roi();
      out << " volume(s) " << shape(m.val_data->info().sample_shape)
          << ", sliding window " << r[0] << "x" << r[1] << "x" << r[2]
          << " overlap " << m.cfg.validation.overlap << " "
          << m.cfg.validation.blend << ", sums on " << m.cfg.validation.offload;
    }
  }
  int64_t numel = 0;
  for (const auto& p : m.params)
    numel += p.numel();
  out << "\nmodel: " << m.cfg.model.name << " ("
      << (m.patches ? "feature_size " : "hidden ")
      << (m.patches ? m.cfg.model.feature_size : m.cfg.model.hidden)
      << ", depth " << m.cfg.model.depth << ", norm " << m.cfg.model.norm
      << ", " << m.num_classes << " classes), " << numel << " parameters ("
      << format_bytes(numel * 4.0) << " fp32), optimizer "
      << m.cfg.training.optimizer << " lr " << m.cfg.training.lr << ", amp "
      << m.cfg.training.amp << "\nwindow: effective batch "
      << m.sampler->effective_batch() << " = " << m.comm.size() << " ranks x "
      << m.plan.accumulation_steps << " micro-steps x " << m.plan.micro_batch;
  if (m.sampler->effective_batch() !=
      m.comm.size() * m.plan.accumulation_steps * m.plan.micro_batch) {
    out << " (last micro-batch smaller)";
  }
  out << "; " << m.sampler->windows_per_epoch()
      << " windows/epoch; gradient sync: " << m.grad_sync->num_buckets()
      << " bucket(s), "
      << format_bytes(static_cast<double>(m.grad_sync->bytes_per_sync()))
      << " per window over " << m.comm.backend();
  out << "\nmemory plan: budget ";
  if (m.budget.limited()) {
    out << m.budget.spec << " = "
        << format_bytes(static_cast<double>(m.budget.bytes)) << " (usable "
        << format_bytes(static_cast<double>(m.budget.usable())) << ")";
  } else {
    out << "none";
  }
  out << "; checkpointing " << m.cfg.training.gradient_checkpointing << ": "
      << m.plan.checkpointed_segments << "/" << m.model->num_segments()
      << " segments; predicted peak "
      << (m.plan.predicted_peak > 0
              ? format_bytes(static_cast<double>(m.plan.predicted_peak))
              : std::string("not measured"))
      << "; " << m.plan.note;
  return out.str();
}

NamedTensors Trainer::named_parameters() const {
  NamedTensors out;
  for (const auto& item : impl_->model->named_parameters()) {
    out.emplace_back(item.key(), item.value());
  }
  return out;
}

int64_t Trainer::windows_per_epoch() const {
  return impl_->sampler->windows_per_epoch();
}

int64_t Trainer::checkpointed_segments() const {
  return impl_->model->checkpointed();
}

int64_t Trainer::effective_batch() const {
  return impl_->sampler->effective_batch();
}

}  // namespace memtrain
