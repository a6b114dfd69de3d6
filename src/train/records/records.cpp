#include "train/records/records.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "memtrain/memory/device_memory.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {

nlohmann::json number_or_null(double d) {
  return std::isnan(d) ? nlohmann::json(nullptr) : nlohmann::json(d);
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

nlohmann::json pretrained_record(const LoadReport& r, bool strict) {
  nlohmann::json mismatched = nlohmann::json::array();
  for (const auto& x : r.mismatched)
    mismatched.push_back(
        {{"name", x.name}, {"file", x.file}, {"model", x.model}});
  return {
      {"type", "pretrained"},
      {"path", r.path},
      {"entry", r.entry},
      {"renamed", r.renamed},
      {"strict", strict},
      {"model_tensors", r.model_tensors},
      {"loaded", r.loaded.size()},
      {"missing", r.missing},
      {"unexpected", r.unexpected},
      {"mismatched", mismatched},
      {"counters_absent", r.counters_absent.size()}};
}

nlohmann::json epoch_record(const EpochFacts& f, const nlohmann::json& val) {
  nlohmann::json rec = val.is_object() ? val : nlohmann::json::object();
  rec["type"] = "epoch";
  rec["epoch"] = f.epoch;
  rec["windows"] = f.windows;
  rec["train_loss"] = f.train_loss;
  rec["mem_held"] = f.mem_held;
  rec["oom_retries"] = f.oom_retries;
  if (f.checksum) {
    rec["param_checksum"] = hex(*f.checksum);
    rec["replicas_identical"] = true;
  }
  rec["mem_peak"] = f.mem_peak;
  rec["mem_reserved"] = f.mem_reserved;
  rec["cache_releases"] = f.cache_releases;
  rec["epoch_s"] = f.seconds;
  return rec;
}

nlohmann::json checkpoint_record(
    int64_t step, int64_t epoch, const std::string& path, double seconds) {
  return {
      {"type", "checkpoint"},
      {"step", step},
      {"epoch", epoch},
      {"path", path},
      {"seconds", seconds}};
}

nlohmann::json leak_warning_record(int64_t epoch, const std::string& warning) {
  return {{"type", "warning"}, {"epoch", epoch}, {"leak_warning", warning}};
}

// The host plan's holders (Note [Host plan]) as a window boundary measured
// them, on the rank with the largest resident set: the CPU device's
// reserved bytes; the offload pool; the other host-domain buffers
// (batches, the loader's and prefetcher's); outside, the resident set less
// what is counted, and of what it holds: glibc's uncounted blocks
// (LibTorch's tables, HDF5's chunk caches, MPI, oneDNN's caches), glibc's
// free bytes, file-backed pages.
nlohmann::json host_holders(const WindowResult& r) {
  const auto at_least_0 = [](int64_t v) { return std::max<int64_t>(v, 0); };
  return {
      {"CPU device", at_least_0(r.host_counted - r.host_counted_host)},
      {"offload pool", r.host_pool_reserved},
      {"host buffers", at_least_0(r.host_counted_host - r.host_pool_reserved)},
      {"outside", at_least_0(r.host_rss - r.host_counted)},
      {"outside_glibc_used",
       at_least_0(r.host_malloc_used - r.host_counted_host)},
      {"outside_glibc_free", r.host_malloc_free},
      {"outside_files", r.host_rss_file}};
}

nlohmann::json window_record(
    const RunState& run, const RunCounters& counters, const WindowResult& r) {
  const memory::Stats s = memory::stats();
  nlohmann::json j = {
      {"type", "window"},
      {"epoch", r.epoch},
      {"window", r.window},
      {"step", r.step},
      {"loss", r.loss},
      {"lr", r.lr},
      {"micro_batch", r.micro_batch},
      {"accum_steps", r.micro_steps},
      {"effective_batch", run.shape.effective_batch},
      {"samples", r.samples},
      {"samples_per_s", r.samples / std::max(r.seconds, 1e-9)},
      {"allreduce_calls", r.allreduce_calls},
      {"allreduce_bytes", r.allreduce_bytes},
      {"allgather_calls", r.allgather_calls},
      {"allgather_bytes", r.allgather_bytes},
      {"syncbn_calls", r.syncbn_calls},
      {"syncbn_bytes", r.syncbn_bytes},
      {"data_wait_s", r.data_wait_s},
      {"t_data_s", r.data_wait_s},
      {"t_compute_s", r.compute_s},
      {"t_comm_exposed_s", r.comm_exposed_s},
      {"t_optimizer_s", r.optimizer_s},
      {"host_syncs", r.host_syncs},
      {"buckets_early", r.buckets_early},
      {"window_s", r.seconds},
      {"mem_allocated", r.mem_allocated},
      {"mem_reserved", r.mem_reserved},
      {"mem_reserved_rank", r.mem_reserved_rank},
      {"mem_peak", r.mem_peak},
      {"mem_peak_rank", r.mem_peak_rank},
      {"mem_peak_reserved", r.mem_peak_reserved},
      {"host_reserved", r.host_reserved},
      {"host_peak", r.host_peak},
      {"host_rss", r.host_rss},
      {"host_rss_rank", r.rss_rank},
      {"host_rss_file", r.host_rss_file},
      {"host_rss_peak", r.host_rss_peak},
      {"host_counted", r.host_counted},
      {"host_malloc_free", r.host_malloc_free},
      {"oom_retries", r.oom_retries_max},
      {"oom_retries_rank", r.oom_retries_rank},
      {"oom_retries_total", r.oom_retries_total},
      {"cache_releases", r.cache_releases},
      {"cache_release_s", s.cache_release_seconds}};
  for (const auto& [phase, bytes] : r.phase_peaks)
    j["mem_peak_" + phase] = bytes;
  if (r.host_syncs_seen >= 0)  // MEMTRAIN_WATCH_HOST_READS
    j["host_syncs_seen"] = r.host_syncs_seen;
  if (r.feature_cache_hits >= 0) {
    j["feature_cache_hits"] = r.feature_cache_hits;
    j["feature_cache_misses"] = r.feature_cache_misses;
    j["feature_cache_bytes"] = r.feature_cache_bytes;
  }
  // Where memtrain counts host memory (the CPU device's accounting
  // allocator): on CUDA nothing is counted and the pool is page-locked
  // outside glibc, so the parts would not add up.
  if (r.host_counted > 0)
    j["host_holders"] = host_holders(r);
  j["skipped_steps"] = run.scaler->enabled() ? run.scaler->skipped_steps()
                                             : counters.nonfinite_skips;
  if (run.scaler->enabled())
    j["loss_scale"] = r.loss_scale;
  return j;
}

double ValResult::metric(const std::string& key) const {
  if (key == "val_loss")
    return loss;
  for (const ValMetric& m : metrics) {
    if (m.key == key)
      return m.value;
  }
  throw Error("this validation does not report " + key);
}

nlohmann::json validation_record(
    const ValResult& v, nlohmann::json& rec, std::string& line) {
  rec["val_loss"] = v.loss;
  rec["val_samples"] = v.samples;
  rec["val_device_peak"] = v.device_peak;
  rec["val_host_peak"] = v.host_peak;
  rec["val_oom_retries"] = v.oom_retries;
  rec["val_batch"] = v.batch;
  rec["val_seconds"] = v.seconds;
  nlohmann::json vrec = {
      {"type", "validation"},
      {"epoch", v.epoch},
      {"val_loss", v.loss},
      {"val_device_peak", v.device_peak},
      {"val_host_peak", v.host_peak},
      {"val_seconds", v.seconds},
      {"val_oom_retries", v.oom_retries}};
  std::ostringstream out;
  out << ", val loss " << v.loss;
  // The task's metrics, in its order (Note [Tasks]); val_metrics lists
  // them with their direction, for readers of the file (progress.png).
  nlohmann::json order = nlohmann::json::array();
  for (const ValMetric& m : v.metrics) {
    rec[m.key] = number_or_null(m.value);
    vrec[m.key] = number_or_null(m.value);
    order.push_back({{"key", m.key}, {"better", to_string(m.better)}});
    if (!m.text.empty())
      out << ", " << m.text;
  }
  vrec["val_metrics"] = std::move(order);
  if (!v.details.empty())
    vrec.update(nlohmann::json::parse(v.details));
  line += out.str();
  return vrec;
}

namespace {

// validation.best_metric's metric of this run (key "" for none).
using BestChoice = MetricSpec;

BestChoice best_choice(const RunState& run) {
  const std::string& m = run.cfg.validation.best_metric;
  if (m == "none")
    return {};
  std::vector<MetricSpec> choices;
  for (const MetricSpec& s : run.task->metrics()) {
    if (s.better != Better::kNone)
      choices.push_back(s);
  }
  const bool auto_choice = m == "auto";
  if (auto_choice && !choices.empty())
    return {choices.front().key, choices.front().better};
  if (m == "val_loss" || (auto_choice && choices.empty()))
    return {"val_loss", Better::kLower};
  std::string names;
  for (const MetricSpec& s : choices) {
    if (s.key == m)
      return s;
    names += (names.empty() ? "" : ", ") + s.key;
  }
  throw Error(detail::concat(
      "validation.best_metric=",
      m,
      ": this run reports ",
      names,
      " (",
      run.task->kind_words(),
      ") and val_loss; choose one of those, auto or none"));
}

}  // namespace

std::string best_metric(const RunState& run) {
  return best_choice(run).key;
}

bool improve_best(
    const RunState& run,
    RunCounters& counters,
    const ValResult& v,
    int64_t step) {
  const BestChoice choice = best_choice(run);
  if (choice.key.empty())
    return false;
  const double value = v.metric(choice.key);
  const BestMode mode = run.cfg.validation.best_mode;
  const bool larger =
      mode == BestMode::kMax ||
      (mode == BestMode::kAuto && choice.better == Better::kHigher);
  const double best = counters.best_value;
  if (std::isnan(value) ||
      (!std::isnan(best) && !(larger ? value > best : value < best)))
    return false;
  counters.best_value = value;
  counters.best_step = step;
  return true;
}

nlohmann::json plan_json(const RunState& run, const RunCounters& counters) {
  const MemoryPlan& plan = run.plan;
  nlohmann::json probes = nlohmann::json::array();
  for (const auto& p : plan.probes) {
    probes.push_back(
        {{"micro_batch", p.micro},
         {"checkpointed_segments", p.tier.segments},
         {"selective", p.tier.selective},
         {"offload", p.tier.offload},
         {"tier", describe(p.tier, run.model->num_segments())},
         {"fits", p.fits},
         {"seconds_per_sample", p.seconds_per_sample},
         {"peak_bytes", p.peak},
         {"host_bytes", p.host_bytes},
         {"extraction_chunk", p.chunk},
         {"faster_form", p.faster_form}});
  }
  nlohmann::json host_holders = nlohmann::json::array();
  for (const auto& h : run.host_plan.holders)
    host_holders.push_back(
        {{"name", h.name}, {"bytes", h.bytes}, {"how", h.how}});
  std::vector<std::string> segments(
      run.model->segment_names().begin(),
      run.model->segment_names().begin() + plan.checkpointed_segments);
  return {
      {"budget", run.budget.spec},
      {"budget_bytes", run.budget.bytes},
      {"headroom", run.budget.headroom},
      {"usable_bytes", run.budget.limited() ? run.budget.usable() : 0},
      // The budget is the whole process's: what the process held outside
      // the allocator at start-up, and the allocator's cap (the rest).
      {"outside_allocator_bytes", run.budget.outside},
      {"allocator_cap_bytes", run.budget.allocator_cap()},
      {"device", run.placement.describe()},
      {"memory_backend", memory::backend_name()},
      {"world_size", run.comm.size()},
      {"effective_batch", run.shape.effective_batch},
      {"micro_batch", plan.micro_batch},
      {"accumulation_steps", plan.accumulation_steps},
      // Note [Planning the extraction chunk]: 0, 0 when not planned.
      {"extraction_chunk", plan.chunk},
      {"extraction_units", plan.chunk_units},
      // Note [Planning the faster form]: "" for a model of one form.
      {"model_form", plan.form},
      {"gradient_checkpointing",
       to_string(run.cfg.training.gradient_checkpointing)},
      {"checkpointed_segments", segments},
      {"selective_recompute", plan.selective},
      {"offload", plan.offload},
      {"host_budget_bytes", run.host_plan.budget},
      {"host_budget", run.host_plan.budget_note},
      {"host_holders", host_holders},
      {"prefetch_depth", run.loader ? run.loader->depth() : 0},
      {"host_pool_cap_bytes",
       run.host_pool ? run.host_pool->stats().budget : 0},
      {"predicted_host_bytes", plan.predicted_host_bytes},
      // Note [Offload that saves nothing]: null where not probed.
      {"offload_saving_bytes",
       plan.offload_saving ? nlohmann::json(*plan.offload_saving)
                           : nlohmann::json(nullptr)},
      {"offload_saving_micro_batch", plan.offload_saving_micro},
      {"amp", to_string(run.cfg.training.amp)},
      {"predicted_peak_bytes", plan.predicted_peak},
      {"window_micro_batches", plan.window_micro_batches},
      {"measured_peak_bytes", counters.measured_peak},
      {"note", plan.note},
      {"probes", probes}};
}

std::string describe_run(const RunState& m) {
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
      << (ti.paired ? std::string("pairs of ") : std::string())
      << to_string(ti.kind) << " " << shape(ti.sample_shape) << " "
      << ti.sample_dtype;
  if (ti.paired) {
    out << " and " << ti.context_dataset() << " [" << ti.context_features << "]"
        << (ti.row_labels.empty() ? "" : " with /pair_ids");
  } else {
    if (ti.targets > 0)  // docs/data-format.md, "Targets"
      out << ", " << ti.targets << " targets a row";
    else
      out << ", " << ti.num_classes << " classes";
    if (ti.context_features > 0)
      out << ", context features " << ti.context_features;
  }
  m.task->describe_data(m, out);
  const int64_t depth = m.loader ? m.loader->depth() : 0;
  out << "; prefetch " << depth << " batches"
      << (m.cfg.data.prefetch == kPrefetchAuto ? " (auto)" : "") << " on "
      << (depth > 0 ? m.cfg.data.read_threads : 0) << " reader thread(s)";
  if (m.val_data) {
    out << "; val '" << m.val_data->info().path << "' "
        << m.val_data->info().num_samples;
    m.task->describe_val(m, out);
  }
  int64_t numel = 0;
  for (const auto& p : m.params)
    numel += p.numel();
  BannerFacts facts;
  facts.width = m.task->describe_width(m);
  facts.buffers = m.buffers.size();
  out << "\nmodel: " << m.cfg.model.name << " ("
      << model_words(m.cfg.model, facts);
  out << ", " << m.task->describe_outputs(m) << "), " << numel
      << " parameters (" << format_bytes(numel * 4.0) << " fp32)";
  if (!m.frozen.empty()) {
    int64_t trained = 0;
    for (const auto& p : m.trainable)
      trained += p.numel();
    out << ", " << numel - trained << " of them frozen (" << m.frozen.size()
        << " tensors, model.freeze)";
  }
  if (!m.cfg.model.pretrained.empty())
    out << ", from model.pretrained " << m.cfg.model.pretrained;
  out << ", optimizer " << m.cfg.training.optimizer << " lr "
      << m.cfg.training.lr << ", amp " << m.cfg.training.amp;
  if (m.cfg.training.label_smoothing > 0.0)
    out << ", label smoothing " << m.cfg.training.label_smoothing;
  out << "\nwindow: effective batch " << m.shape.effective_batch << " = "
      << m.comm.size() << " ranks x " << m.shape.accumulation_steps
      << " micro-steps x " << m.shape.micro_batch << m.task->sample_word();
  if (m.shape.last_micro_smaller()) {
    out << " (last micro-batch smaller)";
  }
  out << "; " << m.sampler->windows_per_epoch()
      << " windows/epoch; gradient sync: " << m.grad_sync->num_buckets()
      << " bucket(s), "
      << format_bytes(static_cast<double>(m.grad_sync->bytes_per_sync()))
      << " per window over " << m.comm.backend() << " on "
      << m.placement.describe();
  out << "\nmemory plan: budget ";
  if (m.budget.limited()) {
    out << m.budget.spec << " = "
        << format_bytes(static_cast<double>(m.budget.bytes)) << " (usable "
        << format_bytes(static_cast<double>(m.budget.usable())) << ")";
  } else {
    out << "none";
  }
  out << "; checkpointing " << m.cfg.training.gradient_checkpointing << ": "
      << describe(
             Tier{
                 m.plan.checkpointed_segments,
                 m.plan.selective,
                 m.plan.offload},
             m.model->num_segments())
      << "; predicted peak "
      << (m.plan.predicted_peak > 0
              ? format_bytes(static_cast<double>(m.plan.predicted_peak))
              : std::string("not measured"));
  if (m.plan.predicted_peak > 0 && m.plan.window_micro_batches.size() > 1) {
    out << " (the largest over a window's micro-batches of";
    const char* sep = " ";
    for (const int64_t k : m.plan.window_micro_batches) {
      out << sep << k;
      sep = ", ";
    }
    out << ")";
  }
  out << "; " << m.plan.note;
  if (m.host_plan.budget > 0)
    out << "\n" << memory::describe(m.host_plan);
  if (m.host_pool) {
    out << "\nhost offload pool: capped at "
        << format_bytes(static_cast<double>(m.host_pool->stats().budget))
        << " (what the host plan's other holders leave)";
    if (m.plan.offload) {
      out << "; predicted "
          << format_bytes(static_cast<double>(m.plan.predicted_host_bytes));
    }
  }
  if (!m.plan.probes.empty()) {
    out << "\nmemory probes (micro-batch, tier: peak, host bytes, time per "
           "sample):";
    for (const auto& p : m.plan.probes) {
      out << "\n  " << p.micro << ", "
          << describe(p.tier, m.model->num_segments()) << ": "
          << format_bytes(static_cast<double>(p.peak)) << ", "
          << format_bytes(static_cast<double>(p.host_bytes)) << ", ";
      if (p.faster_form)
        out << "faster form, ";
      if (p.fits) {
        out << p.seconds_per_sample * 1e3 << " ms";
      } else {
        out << "does not fit";
      }
    }
  }
  return out.str();
}

}  // namespace memtrain
