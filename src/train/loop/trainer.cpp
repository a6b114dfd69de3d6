#include "memtrain/train/loop/trainer.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <sstream>

#include "memtrain/device/placement.h"
#include "memtrain/dist/replica_check.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/monitor.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/train/logs/metrics.h"
#include "memtrain/train/logs/progress.h"
#include "memtrain/train/run_files/output_dir.h"
#include "memtrain/util/atomic_file.h"
#include "memtrain/util/clock.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "memtrain/weights/dinov3_weights.h"
#include "memtrain/weights/model_state.h"
#include "train/loop/validate.h"
#include "train/records/records.h"
#include "train/run_files/run_checkpoint.h"
#include "train/state/run_state.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

// The model's parameters and buffers by name (model_state.h), copied to
// host memory.
NamedTensors host_parameters(const RunState& run) {
  NamedTensors out;
  for (const auto& [name, t] : state_tensors(*run.model))
    out.emplace_back(name, run.placement.to_host(t.detach()));
  return out;
}

// The weights as a safetensors file PyTorch loads, after `windows`;
// `extra` adds to the metadata.
void write_parameters(
    const RunState& run,
    const std::string& path,
    int64_t windows,
    const std::map<std::string, std::string>& extra = {}) {
  std::map<std::string, std::string> meta = {
      {"format", "pt"},
      {"producer", "memtrain"},
      {"model", to_string(run.cfg.model.name)},
      {"windows", std::to_string(windows)}};
  meta.insert(extra.begin(), extra.end());
  save_safetensors(path, host_parameters(run), meta);
}

}  // namespace

struct Trainer::Impl {
  Options options;
  bool writer = false;                       // rank 0 with outputs on
  std::unique_ptr<Placement> own_placement;  // when options.placement is null
  std::unique_ptr<RunState> run;
  RunCounters counters;
  ResumePoint start;
  bool prepared = false;
  std::unique_ptr<MetricsLog> metrics;
  std::unique_ptr<Progress> progress;
  std::unique_ptr<memory::LeakDetector> leak;
  bool pretrained_done = false;  // load_pretrained() ran (or had nothing)
  nlohmann::json pretrained;     // its metrics.jsonl record (null: none)

  // Per epoch: loss and samples so far, and OOM retries.
  struct Epoch {
    int64_t index = 0;
    double loss = 0.0;
    int64_t samples = 0;
    int64_t ooms = 0;
    Clock::time_point began = Clock::now();
  };

  void start_run();
  // A window's bookkeeping: totals, its record, the progress line, the
  // replica check. Returns whether a stop was requested.
  bool record_window(
      WindowResult r, Epoch& e, int64_t total, TrainSummary& summary);
  // After the last window: the final replica check, model.safetensors,
  // memory_plan.json with the measured peak.
  void finish_run(int64_t step, bool checked_last, TrainSummary& summary);
  void check_replicas(const char* when, uint64_t* checksum);
  // The epoch's end: record, validation, replica check, checkpoint, memory
  // line and leak warning. Collective.
  void end_epoch(
      const Epoch& e, int64_t step, TrainSummary& summary, bool& checked_last);
  void save_checkpoint(
      int64_t step, int64_t epoch, int64_t samples_done, double loss_sum) {
    const nlohmann::json rec = save_run_checkpoint(
        *run, counters, writer, step, epoch, samples_done, loss_sum);
    if (!rec.is_null())
      metrics->write(rec);
  }
};

Trainer::Trainer(const TrainConfig& cfg, Communicator& comm, Options options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  m.writer = options.write_outputs && comm.rank() == 0;
  if (!options.placement)
    m.own_placement = Placement::cpu();
  const Placement& placement =
      options.placement ? *options.placement : *m.own_placement;
  m.run = set_up_run(cfg, comm, placement);
  if (!options.faster_forms)
    m.run->model->set_memory_lean(true);
  best_metric(*m.run);  // refuses a metric this run does not report
  m.counters.releases_at_start = memory::stats().cache_releases;
  m.leak = std::make_unique<memory::LeakDetector>(
      cfg.memory.leak_warn_mib * 1024.0 * 1024.0, cfg.memory.leak_epochs);
  if (m.writer)
    make_directories(cfg.output.dir);
  // metrics.jsonl is opened by run(): a refused resume must not touch it.
  m.metrics = std::make_unique<MetricsLog>();
  m.progress = std::make_unique<Progress>(
      comm.rank() == 0 ? options.progress : nullptr,
      options.progress_is_tty,
      cfg.output.progress_every_s);
}

Trainer::~Trainer() = default;

void Trainer::prepare() {
  Impl& m = *impl_;
  if (m.prepared)
    return;
  warm_up_host_plan(*m.run);
  plan_run(*m.run, m.options.faster_forms);
  if (!plan_host(*m.run, /*may_replan=*/true)) {
    const std::string first = m.run->plan.note;
    plan_run(*m.run, m.options.faster_forms);
    m.run->plan.note = first +
                       "; planned again under a lower cap: on a rank the "
                       "plan's peak with its slack passed what the host "
                       "plan's other holders left after the probes; " +
                       m.run->plan.note;
    plan_host(*m.run, /*may_replan=*/false);
  }
  m.counters.val_micro = m.run->cfg.data.val_batch_size > 0
                             ? m.run->cfg.data.val_batch_size
                             : m.run->plan.micro_batch;
  // Releases from here on are the run's own (the probes released too).
  m.counters.releases_at_start = memory::stats().cache_releases;
  m.prepared = true;
}

std::string Trainer::resume(const std::string& spec) {
  std::string what;
  impl_->start = resume_run(*impl_->run, impl_->counters, spec, what);
  return what;
}

// Before the first window: every rank at the same position, every replica
// from rank 0's parameters, the outputs opened. Collective.
void Trainer::Impl::start_run() {
  RunState& r = *run;
  // Each rank resumed by itself (from a shared output.dir): they must
  // agree on where they continue.
  {
    auto pos = torch::tensor(
        {start.step, -start.step, start.window, -start.window}, torch::kInt64);
    r.comm.all_reduce(pos, ReduceOp::kMax);
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
    for (auto& p : r.params)
      r.comm.broadcast(p, 0);
  }
  broadcast_buffers(r.comm, r.buffers);
  if (writer) {
    // --output.overwrite=true on a fresh run: the previous run's files go
    // (Note [Output folders]); a refused run would not have got here.
    if (!start.resumed && r.cfg.output.overwrite) {
      const auto gone = clear_previous_run(r.cfg.output.dir);
      if (!gone.empty()) {
        log_event(
            "output.overwrite: deleted " + std::to_string(gone.size()) +
            " file(s) of the previous run in " + r.cfg.output.dir);
      }
    }
    write_file_atomically(
        r.cfg.output.dir + "/config.resolved.yaml", r.cfg.to_yaml());
    write_file_atomically(
        r.cfg.output.dir + "/memory_plan.json",
        plan_json(r, counters).dump(2) + "\n");
    r.task->write_run_files(r, r.cfg.output.dir);  // episodes.json
    MetricsOutputs out;
    out.dir = r.cfg.output.dir;
    out.resumed = start.resumed;
    out.resume_step = start.step;
    out.resume_epoch = start.epoch;
    for (const MetricSpec& spec : r.task->metrics())
      out.val_metrics.push_back(spec.key);
    out.dice_classes = r.task->dice_classes(r);
    out.budget_bytes = r.budget.limited() ? r.budget.bytes : 0;
    metrics = std::make_unique<MetricsLog>(out);
    if (!pretrained.is_null())
      metrics->write(pretrained);
    // What the first window starts from, for an outside reference (such
    // as benchmarks/vs_pytorch) to start from the same parameters.
    if (r.cfg.output.save_initial) {
      write_parameters(
          r, r.cfg.output.dir + "/initial.safetensors", start.step);
    }
  }
  counters.monitor.begin_window();
}

bool Trainer::Impl::record_window(
    WindowResult r, Epoch& e, int64_t total, TrainSummary& summary) {
  const RunState& rs = *run;
  ++summary.windows;
  summary.oom_retries += r.oom_retries;
  e.ooms += r.oom_retries_max;
  summary.skipped_steps += r.skipped ? 1 : 0;
  e.loss += r.loss * r.samples;
  e.samples += r.samples;
  // The model's own phases (dinov3: the backbone's extraction and the
  // context's), this rank's peaks since the last window.
  r.phase_peaks = rs.model->take_phase_peaks();
  if (rs.feature_cache) {  // Note [The feature cache]
    std::tie(r.feature_cache_hits, r.feature_cache_misses) =
        rs.feature_cache->take_counts();
    r.feature_cache_bytes = rs.feature_cache->held();
  }
  metrics->write(window_record(rs, counters, r));
  progress->window(
      e.index,
      rs.cfg.training.epochs,
      r.window,
      rs.sampler->windows_per_epoch(),
      r.loss,
      r.samples / std::max(r.seconds, 1e-9),
      summary.windows,
      total - start.step);
  const bool stop = r.stop_requested;
  summary.window_results.push_back(std::move(r));
  if (rs.cfg.dist.check_replicas == CheckReplicas::kWindow)
    check_replicas("after a window", &summary.checksum);
  return stop;
}

void Trainer::Impl::finish_run(
    int64_t step, bool checked_last, TrainSummary& summary) {
  const RunState& rs = *run;
  broadcast_buffers(rs.comm, rs.buffers);  // model.safetensors: rank 0's
  if (rs.cfg.dist.check_replicas != CheckReplicas::kOff && !checked_last) {
    check_replicas("at the end of training", &summary.checksum);
  } else if (rs.cfg.dist.check_replicas == CheckReplicas::kOff) {
    summary.checksum = parameter_checksum(rs.params);
  }
  if (!writer)
    return;
  write_parameters(rs, rs.cfg.output.dir + "/model.safetensors", step);
  write_file_atomically(
      rs.cfg.output.dir + "/memory_plan.json",
      plan_json(rs, counters).dump(2) + "\n");
}

void Trainer::Impl::check_replicas(const char* when, uint64_t* checksum) {
  if (!replicas_identical(run->comm, run->params, checksum)) {
    throw InternalError(
        std::string("replica check failed ") + when +
        ": this rank's parameters (checksum " + hex(*checksum) +
        ") differ from rank 0's. Likely causes: ranks run "
        "different memtrain or LibTorch builds, "
        "non-deterministic kernels, or a memory error.");
  }
}

TrainSummary Trainer::run() {
  Impl& m = *impl_;
  prepare();
  load_pretrained();
  RunState& run = *m.run;
  TrainSummary summary;
  // Everything from here on that is not explicitly host memory is device
  // memory: activations, gradients, optimizer state, batches.
  memory::DeviceScope device;
  m.start_run();
  const int64_t epochs = run.cfg.training.epochs;
  const int64_t wpe = run.sampler->windows_per_epoch();
  int64_t total = epochs * wpe;
  if (run.cfg.training.max_windows > 0)
    total = std::min(total, run.cfg.training.max_windows);
  const int64_t batch = run.shape.effective_batch;
  const int64_t every = run.cfg.training.checkpoint_every;
  bool checked_last = false;
  int64_t step = m.start.step;  // windows done, this run and before it
  for (int64_t epoch = m.start.epoch; epoch < epochs; ++epoch) {
    // A resumed epoch carries on with the loss of its windows before the
    // checkpoint, so its record is the uninterrupted run's.
    const bool resumed = m.start.resumed && epoch == m.start.epoch;
    // A run stopped on an epoch's last window owes that epoch its end
    // (validation, record, checkpoint) even when no window is left: the
    // last epoch's too.
    const bool owes_end = resumed && m.start.window >= wpe;
    if (step >= total && !owes_end)
      break;
    m.counters.monitor.begin_epoch();
    Impl::Epoch e;
    e.index = epoch;
    e.loss = resumed ? m.start.epoch_loss : 0.0;
    int64_t w = resumed ? m.start.window : 0;
    e.samples = std::min(w * batch, run.sampler->num_samples());
    std::optional<WindowPlan> next;  // planned with the window before
    for (; w < wpe && step < total; ++w) {
      const WindowPlan plan =
          next ? std::move(*next) : run.sampler->plan(epoch, w);
      next.reset();
      if (w + 1 < wpe && step + 1 < total)
        next = run.sampler->plan(epoch, w + 1);  // for the prefetcher
      WindowResult r =
          run_window(run, m.counters, plan, next ? &*next : nullptr);
      r.step = ++step;
      const bool stop = m.record_window(std::move(r), e, total, summary);
      checked_last = run.cfg.dist.check_replicas == CheckReplicas::kWindow;
      if (stop) {
        // Every rank saw the request in the same all-reduce: checkpoint
        // and stop, before anything else (the grace time is short). On the
        // epoch's last window the checkpoint's position is the epoch's end
        // with its validation still to come: a resumed run starts there.
        summary.stopped = true;
        ++w;
        break;
      }
      if (every > 0 && step % every == 0 && w + 1 < wpe && step < total)
        m.save_checkpoint(step, epoch, (w + 1) * batch, e.loss);
    }
    if (w < wpe || summary.stopped) {
      m.save_checkpoint(step, epoch, w * batch, e.loss);
      m.progress->line(
          summary.stopped
              ? "stop requested (SIGTERM, SIGUSR1 or SIGINT on a rank): "
                "checkpoint written at step " +
                    std::to_string(step) +
                    (w == wpe ? "; the epoch's validation runs on --resume"
                              : "")
              : "stopped after training.max_windows=" +
                    std::to_string(run.cfg.training.max_windows) +
                    " windows; checkpoint written");
      break;
    }
    m.end_epoch(e, step, summary, checked_last);
  }
  m.finish_run(step, checked_last, summary);
  // No rank returns (and maybe exits) before rank 0 has written the model.
  run.comm.barrier();
  return summary;
}

void Trainer::Impl::end_epoch(
    const Epoch& e, int64_t step, TrainSummary& summary, bool& checked_last) {
  RunState& r = *run;
  const int64_t epochs = r.cfg.training.epochs;
  // The leak check reads the bytes held at the same point of every epoch:
  // after its last window, before validation.
  const memory::Stats held = memory::stats();
  const auto leaked = leak->observe(e.index, held.allocated);
  EpochFacts facts;
  facts.epoch = e.index;
  facts.windows = r.sampler->windows_per_epoch();
  facts.train_loss = e.loss / e.samples;
  facts.mem_held = held.allocated;
  facts.oom_retries = e.ooms;
  nlohmann::json val;  // the validation's fields of the epoch record
  std::ostringstream out;
  out << "epoch " << e.index + 1 << "/" << epochs << " done: train loss "
      << e.loss / e.samples;
  std::string line = out.str();
  if (r.task->cannot_validate(r).empty() &&
      ((e.index + 1) % r.cfg.validation.every_epochs == 0 ||
       e.index + 1 == epochs)) {
    const auto val_start = Clock::now();
    release_cache_if_due(r, /*before_validation=*/true);
    broadcast_buffers(r.comm, r.buffers);  // validate rank 0's statistics
    counters.monitor.note_peak();          // the last window's step
    memory::reset_peak();
    const int64_t host_before = memory::stats().host_allocated;
    ValResult v = validate(r, counters, options.write_outputs ? e.index : -1);
    v.device_peak = memory::stats().peak_allocated;
    v.host_peak = memory::stats().host_peak - host_before;
    counters.monitor.note_peak();
    counters.monitor.begin_window();  // the next window starts afresh
    v.epoch = e.index;
    v.seconds = seconds_since(val_start);
    summary.validations.push_back(v);
    nlohmann::json vrec = validation_record(v, val, line);
    if (improve_best(r, counters, v, step)) {
      // Written before the epoch's checkpoint, which records it as the best.
      if (writer) {
        char value[64];
        std::snprintf(value, sizeof(value), "%.17g", counters.best_value);
        write_parameters(
            r,
            r.cfg.output.dir + "/best.safetensors",
            step,
            {{"best_metric", best_metric(r)},
             {"best_value", value},
             {"epoch", std::to_string(e.index + 1)}});
      }
      vrec["best"] = true;
      line += " (best)";
    }
    metrics->write(vrec);
  }
  if (r.cfg.dist.check_replicas != CheckReplicas::kOff) {
    if (!checked_last)
      check_replicas("at the end of an epoch", &summary.checksum);
    checked_last = true;
    facts.checksum = &summary.checksum;
  }
  const memory::Stats s = memory::stats();
  facts.mem_peak = counters.monitor.epoch_peak();
  facts.mem_reserved = s.reserved;
  facts.cache_releases = s.cache_releases - counters.releases_at_start;
  facts.seconds = seconds_since(e.began);
  line += " (" + format_duration(facts.seconds) + ")";
  metrics->write(epoch_record(facts, val));
  progress->line(line);
  save_checkpoint(step, e.index + 1, 0, 0.0);
  if (memory::backend_name() != "none") {
    std::ostringstream mem;
    const int64_t peak = counters.monitor.epoch_peak();
    mem << "  memory: peak " << format_bytes(double(peak));
    if (r.budget.limited()) {
      mem << " of budget " << format_bytes(double(r.budget.bytes)) << " ("
          << std::llround(100.0 * double(peak) / double(r.budget.bytes))
          << "%)";
    }
    mem << ", held " << format_bytes(double(held.allocated))
        << " at epoch end, reserved " << format_bytes(double(s.reserved))
        << ", OOM retries " << e.ooms << ", cache releases "
        << s.cache_releases - counters.releases_at_start;
    progress->line(mem.str());
  }
  if (leaked) {
    summary.leak_warnings.push_back(*leaked);
    metrics->write(leak_warning_record(e.index, *leaked));
    progress->line("warning: " + *leaked);
  }
}

std::vector<std::string> Trainer::load_pretrained() {
  Impl& m = *impl_;
  const ModelConfig& cfg = m.run->cfg.model;
  if (m.pretrained_done || cfg.pretrained.empty() || m.start.resumed) {
    m.pretrained_done = true;
    return {};
  }
  std::vector<std::string> lines;
  const LoadReport r = load_pretrained_weights(
      *m.run->model,
      cfg.pretrained,
      cfg.pretrained_strict,
      "model.pretrained",
      cfg.pretrained_rename,
      &lines);
  m.pretrained_done = true;
  m.pretrained = pretrained_record(r, cfg.pretrained_strict);
  for (const auto& l : lines)
    log_event(l);
  return lines;
}

void Trainer::load_weights(const std::string& path) {
  load_weights_file(*impl_->run->model, path, /*strict=*/true, "--weights");
  impl_->pretrained_done = true;  // these weights, not model.pretrained
}

std::string Trainer::cannot_validate() const {
  return impl_->run->task->cannot_validate(*impl_->run);
}

std::string Trainer::evaluate(std::string* line) {
  Impl& m = *impl_;
  RunState& r = *m.run;
  const std::string why_not = cannot_validate();
  MT_CHECK(why_not.empty(), "eval: ", why_not);
  prepare();  // the validation batch, as in training
  memory::DeviceScope device;
  const auto start = Clock::now();
  memory::reset_peak();
  const int64_t host_before = memory::stats().host_allocated;
  ValResult v = validate(r, m.counters);
  v.device_peak = memory::stats().peak_allocated;
  v.host_peak = memory::stats().host_peak - host_before;
  v.seconds = seconds_since(start);
  nlohmann::json unused;
  std::string text;  // ", val loss ..., val accuracy ..."
  nlohmann::json rec = validation_record(v, unused, text);
  rec["type"] = "eval";
  rec.erase("epoch");
  rec["ranks"] = r.comm.size();
  if (line)
    *line = text.substr(std::min<size_t>(2, text.size()));
  return rec.dump();
}

std::string Trainer::describe() const {
  return describe_run(*impl_->run);
}

NamedTensors Trainer::named_parameters() const {
  return host_parameters(*impl_->run);
}

int64_t Trainer::windows_per_epoch() const {
  return impl_->run->sampler->windows_per_epoch();
}

int64_t Trainer::checkpointed_segments() const {
  return impl_->run->model->checkpointed();
}

const MemoryPlan& Trainer::memory_plan() const {
  return impl_->run->plan;
}

const memory::HostPlan& Trainer::host_plan() const {
  return impl_->run->host_plan;
}

memory::HostPoolStats Trainer::host_pool_stats() const {
  return impl_->run->host_pool ? impl_->run->host_pool->stats()
                               : memory::HostPoolStats{};
}

bool Trainer::selective_recompute() const {
  return impl_->run->model->checkpointed() > 0 &&
         impl_->run->model->recompute() == Recompute::kSelective;
}

int64_t Trainer::effective_batch() const {
  return impl_->run->shape.effective_batch;
}

}  // namespace memtrain
