#include "records.h"

#include <cmath>
#include <cstdio>
#include <sstream>

#include "memtrain/data/volume_rows.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/util/error.h"

namespace memtrain {
namespace {

// NaN (a class or volume with nothing to score) is written as null.
nlohmann::json number_or_null(double d) {
  return std::isnan(d) ? nlohmann::json(nullptr) : nlohmann::json(d);
}

// Note [Volume rows]: Dice per volume and its means, accuracy over rows.
void volume_rows_fields(
    const ValResult& v,
    nlohmann::json& rec,
    nlohmann::json& vrec,
    std::ostringstream& out) {
  nlohmann::json per_class = nlohmann::json::array();
  for (double d : v.dice_per_class)
    per_class.push_back(number_or_null(d));
  nlohmann::json per_volume = nlohmann::json::object();
  for (const auto& [id, d] : v.volume_dice)
    per_volume[std::to_string(id)] = number_or_null(d);
  rec["val_dice"] = number_or_null(v.dice);
  rec["val_accuracy"] = v.accuracy;
  vrec["val_dice"] = number_or_null(v.dice);
  vrec["val_dice_per_class"] = per_class;
  vrec["val_dice_volumes"] = per_volume;
  vrec["val_dice_volume_mean"] = number_or_null(v.volume_dice_mean);
  vrec["val_volumes"] = v.volumes;
  vrec["val_accuracy"] = v.accuracy;
  vrec["val_samples"] = v.samples;
  vrec["val_batch"] = v.batch;
  out << ", val Dice " << v.dice << " (" << v.volumes
      << " volumes), val accuracy " << v.accuracy;
}

}  // namespace

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(
      buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
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
      {"buckets_early", r.buckets_early},
      {"window_s", r.seconds},
      {"mem_allocated", r.mem_allocated},
      {"mem_reserved", r.mem_reserved},
      {"mem_reserved_rank", r.mem_reserved_rank},
      {"mem_peak", r.mem_peak},
      {"mem_peak_rank", r.mem_peak_rank},
      {"mem_peak_reserved", r.mem_peak_reserved},
      {"oom_retries", r.oom_retries_max},
      {"oom_retries_rank", r.oom_retries_rank},
      {"oom_retries_total", r.oom_retries_total},
      {"cache_releases", r.cache_releases},
      {"cache_release_s", s.cache_release_seconds}};
  j["skipped_steps"] = run.scaler->enabled() ? run.scaler->skipped_steps()
                                             : counters.nonfinite_skips;
  if (run.scaler->enabled())
    j["loss_scale"] = r.loss_scale;
  return j;
}

nlohmann::json validation_record(
    const RunState& run,
    const ValResult& v,
    nlohmann::json& rec,
    std::string& line) {
  rec["val_loss"] = v.loss;
  rec["val_samples"] = v.samples;
  rec["val_device_peak"] = v.device_peak;
  rec["val_oom_retries"] = v.oom_retries;
  rec["val_batch"] = v.batch;
  rec["val_seconds"] = v.seconds;
  nlohmann::json vrec = {
      {"type", "validation"},
      {"epoch", v.epoch},
      {"val_loss", v.loss},
      {"val_device_peak", v.device_peak},
      {"val_seconds", v.seconds}};
  std::ostringstream out;
  out << ", val loss " << v.loss;
  if (run.volume_rows()) {
    volume_rows_fields(v, rec, vrec, out);
  } else if (run.volumes()) {
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
    vrec["val_offload"] = run.cfg.validation.offload;
    out << ", val Dice " << v.dice;
  } else {
    rec["val_accuracy"] = v.accuracy;
    vrec["val_accuracy"] = v.accuracy;
    vrec["val_samples"] = v.samples;
    out << ", val accuracy " << v.accuracy;
    if (run.binary()) {  // NaN (one class in data.val) is written as null
      rec["val_auc"] = number_or_null(v.auc);
      vrec["val_auc"] = number_or_null(v.auc);
      out << ", val AUC " << v.auc;
    }
    if (run.episodic()) {  // mean over episodes +- its 95% interval
      rec["val_accuracy_ci95"] = v.accuracy_ci95;
      vrec["val_accuracy_ci95"] = v.accuracy_ci95;
      vrec["val_episodes"] = v.episodes;
      out << " +- " << v.accuracy_ci95 << " (95%, " << v.episodes
          << " episodes)";
    }
  }
  vrec["val_oom_retries"] = v.oom_retries;
  line += out.str();
  return vrec;
}

std::string best_metric(const RunState& run) {
  const std::string& m = run.cfg.validation.best_metric;
  if (m == "none")
    return "";
  const bool dice = run.volumes() || run.volume_rows();
  if (m == "auto")
    return dice ? "val_dice" : "val_accuracy";
  // Rows that belong to volumes report both val_dice and val_accuracy.
  MT_CHECK(
      m == "val_loss" || (m == "val_dice" && dice) ||
          (m == "val_accuracy" && !run.volumes()) ||
          (m == "val_auc" && run.binary()),
      "validation.best_metric=",
      m,
      ": this run reports ",
      run.volume_rows() ? "val_dice, val_accuracy (rows of volumes)"
      : run.volumes()   ? "val_dice (a volumes dataset)"
      : run.binary()    ? "val_accuracy, val_auc (a binary classifier)"
                        : "val_accuracy (a classifier; val_auc needs a "
                          "binary one, model.num_classes=1)",
      " and val_loss; choose one of those, auto or none");
  return m;
}

bool improve_best(
    const RunState& run,
    RunCounters& counters,
    const ValResult& v,
    int64_t step) {
  const std::string m = best_metric(run);
  if (m.empty())
    return false;
  const double value = m == "val_dice"   ? v.dice
                       : m == "val_loss" ? v.loss
                       : m == "val_auc"  ? v.auc
                                         : v.accuracy;
  const std::string& mode = run.cfg.validation.best_mode;
  const bool larger = mode == "max" || (mode == "auto" && m != "val_loss");
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
         {"checkpointed_segments", p.segments},
         {"fits", p.fits},
         {"peak_bytes", p.peak}});
  }
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
      {"gradient_checkpointing", run.cfg.training.gradient_checkpointing},
      {"checkpointed_segments", segments},
      {"amp", run.cfg.training.amp},
      {"predicted_peak_bytes", plan.predicted_peak},
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
    out << " and /features_b [" << ti.context_features << "]"
        << (ti.row_labels.empty() ? "" : " with /pair_ids");
  } else {
    out << ", " << ti.num_classes << " classes";
    if (ti.context_features > 0)
      out << ", context features " << ti.context_features;
  }
  if (ti.kind == SampleKind::kImages && !m.episodic() && !ti.paired) {
    out << "; augment " << m.images.train.describe();
  }
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
    if (m.volume_rows()) {  // Note [Volume rows]
      out << " rows of "
          << describe_volume_rows(index_volume_rows(m.val_data->info()))
          << ", Dice per volume";
    }
    if (m.patches) {
      const auto r = m.roi();
      out << " volume(s) " << (m.val_data->info().ragged ? "up to " : "")
          << shape(m.val_data->info().sample_shape) << ", sliding window "
          << r[0] << "x" << r[1] << "x" << r[2] << " overlap "
          << m.cfg.validation.overlap << " " << m.cfg.validation.blend
          << ", sums on " << m.cfg.validation.offload;
    }
  }
  int64_t numel = 0;
  for (const auto& p : m.params)
    numel += p.numel();
  out << "\nmodel: " << m.cfg.model.name << " (";
  if (m.buffers.empty()) {
    out << (m.patches ? "feature_size " : "hidden ")
        << (m.patches ? m.cfg.model.feature_size : m.cfg.model.hidden)
        << ", depth " << m.cfg.model.depth << ", norm " << m.cfg.model.norm;
  } else {  // the ResNets: fixed layers, batch-norm
    out << m.buffers.size() << " buffers (batch-norm statistics)";
  }
  out << ", "
      << (m.episodic()
              ? m.cfg.model.head + " head on a " +
                    std::to_string(m.cfg.model.embed_dim) + "-wide embedding"
          : m.dual ? std::to_string(m.cfg.model.embed_dim) +
                         "-wide embeddings, contrastive accumulation " +
                         m.cfg.training.contrastive_accumulation
          : m.binary() ? std::string("1 logit: binary")
                       : std::to_string(m.num_classes) + " classes")
      << "), " << numel << " parameters (" << format_bytes(numel * 4.0)
      << " fp32)";
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
      << " micro-steps x " << m.shape.micro_batch
      << (m.episodic() ? " episodes" : "");
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
      << m.plan.checkpointed_segments << "/" << m.model->num_segments()
      << " segments; predicted peak "
      << (m.plan.predicted_peak > 0
              ? format_bytes(static_cast<double>(m.plan.predicted_peak))
              : std::string("not measured"))
      << "; " << m.plan.note;
  return out.str();
}

}  // namespace memtrain
