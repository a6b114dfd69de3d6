// Segmentation of volumes: random patches (PatchSampler), Dice +
// cross-entropy per patch, whole-volume validation by sliding window (Note
// [Whole-volume validation]).

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/device/placement.h"
#include "memtrain/infer/sliding_window.h"
#include "memtrain/input/context_crop.h"
#include "memtrain/metrics/dice_report.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/model/losses.h"
#include "memtrain/model/nets/dinov3_seg.h"
#include "memtrain/model/registry.h"
#include "memtrain/model/volume_model.h"
#include "memtrain/train/eval/validator.h"
#include "memtrain/train/logs/metrics.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"
#include "train/tasks/task.h"

namespace memtrain {
namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i)
    t += (i ? "," : "") + std::to_string(s[i]);
  return t + "]";
}

class VolumeTask : public Task {
 public:
  void set_up(RunState& run) override {
    const TrainConfig& cfg = run.cfg;
    const DatasetInfo& ti = run.train_data->info();
    const std::string warn =
        run.train_data->patch_layout_warning(cfg.data.patch_size);
    if (!warn.empty())
      log_event("warning: data.train: " + warn, /*echo=*/run.comm.rank() == 0);
    // Validation volumes may have any size, not their channels.
    open_val_data(run, /*channels_only=*/true);
    resolve_num_classes(run, /*binary=*/false);
    run.images = resolve_image_transforms(cfg, ti, false);
    check_volume_model(cfg, ti);
    check_cpu_bf16_convolutions(cfg, !run.placement.is_cuda());
    patches_ = std::make_unique<PatchSampler>(
        *run.train_data,
        cfg.data.patch_size,
        cfg.data.patches_per_volume,
        cfg.data.pos_fraction,
        static_cast<uint64_t>(cfg.data.seed),
        cfg.data.flip,
        cfg.validation.padding);
    const ContextView context = context_view(cfg.model);
    if (context.on()) {  // said once, where the padding comes from
      const Box box = context_box({0, 0, 0}, cfg.data.patch_size, context);
      log_event(
          detail::concat(
              "model.context.scale=",
              context.scale,
              ": each patch's context crop is ",
              box.size[0],
              "x",
              box.size[1],
              "x",
              box.size[2],
              " voxels around its centre, resized to the patch; where it "
              "reaches outside a volume it is 0 there, as the sliding "
              "window pads"),
          /*echo=*/run.comm.rank() == 0);
    }
    train_cached_ = cfg.model.feature_cache == FeatureCacheMode::kHost &&
                    patches_span_slices(run);
    run.source = std::make_unique<PatchSource>(
        *run.train_data, *patches_, &run.train_finite, context, train_cached_);
  }

  // The model sees patches.
  std::shared_ptr<Classifier> make_model(const RunState& run) override {
    return memtrain::make_model(
        run.cfg.model,
        volume_model_input(run.cfg, run.train_data->info(), run.num_classes));
  }

  int64_t samples_per_epoch(const RunState&) const override {
    return patches_->num_samples();
  }

  // A per-sample Dice, so that Note [Window weighting] holds.
  at::Tensor loss_sum(
      const at::Tensor& logits, const at::Tensor& y) const override {
    return dice_ce_loss_sum(logits, y);
  }

  std::vector<MetricSpec> metrics() const override {
    return {{"val_dice", Better::kHigher}};
  }

  std::string kind_words() const override {
    return "a volumes dataset";
  }

  std::vector<memory::HostHolder> host_holders(
      const RunState& run) const override {
    if (!run.val_data)
      return {};
    const Validator validator(
        *run.val_data,
        run.cfg.validation,
        run.roi(),
        run.num_classes,
        run.comm,
        run.placement,
        context_view(run.cfg.model));
    int64_t v = 0;
    const int64_t bytes = validator.host_bytes(&v);
    if (bytes == 0)
      return {};
    const DatasetInfo& info = run.val_data->info();
    const auto& e = info.volume_shape(v);
    const auto roi = run.roi();
    memory::HostHolder h;
    h.name = "validation";
    h.bytes = bytes;
    h.how = detail::concat(
        "its largest case, ",
        case_key(info, v),
        " ",
        shape_text({e[0], e[1], e[2]}),
        ", ",
        info.sample_shape[0],
        " channel(s), ",
        run.num_classes,
        " classes, window [",
        roi[0],
        ",",
        roi[1],
        ",",
        roi[2],
        "] x ",
        run.cfg.validation.sw_batch,
        ", sum on the ",
        run.cfg.validation.offload == Offload::kCpu ? "host" : "device",
        ": the case and its mask, then scoring with six tensors of its "
        "probabilities' size (validator.h: case_host_bytes)");
    h.lower =
        "validation.sw_batch and validation.roi for the sliding window's "
        "part; the scoring's is the case's size";
    return {h};
  }

  CacheNeed feature_cache_need(const RunState& run) const override;

  ValResult validate(
      RunState& run, RunCounters&, const std::string& overlay_dir) override {
    Validator validator(
        *run.val_data,
        run.cfg.validation,
        run.roi(),
        run.num_classes,
        run.comm,
        run.placement,
        context_view(run.cfg.model));
    const VolumeValResult v = validator.run(
        [&run](
            const at::Tensor& windows,
            const at::Tensor& context,
            const at::Tensor& origins) {
          return forward(run, windows, context, origins);
        },
        overlay_dir);
    ValResult r;
    r.loss = v.loss;
    r.samples = v.volumes;
    r.oom_retries = v.oom_retries;
    r.batch = v.sw_batch;
    r.metrics = {
        val_metric("val_dice", v.dice.mean(), Better::kHigher, "val Dice")};
    nlohmann::json details = nlohmann::json(
        {{"val_dice_per_class", dice_per_class(v.dice)},
         {"val_cases", dice_cases(v.dice)},
         {"val_volumes", v.volumes},
         {"val_sw_batch", v.sw_batch},
         {"val_offload", to_string(run.cfg.validation.offload)}});
    // The model's own phases in validation (dinov3: the backbone's
    // extraction and the context's), this rank's peaks.
    for (const auto& [phase, bytes] : run.model->take_phase_peaks())
      details["val_mem_peak_" + phase] = bytes;
    if (run.feature_cache) {  // Note [The feature cache]
      const auto [hits, misses] = run.feature_cache->take_counts();
      details["val_feature_cache_hits"] = hits;
      details["val_feature_cache_misses"] = misses;
    }
    r.details = details.dump();
    // The epoch's summary.json (nnU-Net's shape), next to its overlays.
    if (!overlay_dir.empty() && run.comm.rank() == 0)
      write_dice_summary(overlay_dir, v.dice);
    return r;
  }

  std::vector<std::string> dice_classes(const RunState& run) const override {
    return metrics_class_names(
        run.train_data->info().class_names, run.num_classes);
  }

  void describe_data(const RunState& run, std::ostream& out) const override {
    const DataConfig& d = run.cfg.data;
    const auto& p = d.patch_size;
    out << "; patches " << p[0] << "x" << p[1] << "x" << p[2] << ", "
        << d.patches_per_volume << " per volume, flip " << d.flip
        << ", pos_fraction " << d.pos_fraction;
  }

  void describe_val(const RunState& run, std::ostream& out) const override {
    const auto r = run.roi();
    const ValidationConfig& v = run.cfg.validation;
    out << " volume(s) " << (run.val_data->info().ragged ? "up to " : "")
        << shape_text(run.val_data->info().sample_shape) << ", sliding window "
        << r[0] << "x" << r[1] << "x" << r[2] << " overlap " << v.overlap << " "
        << v.blend << ", padding " << v.padding << ", sums on " << v.offload;
  }

  std::string describe_width(const RunState& run) const override {
    return "feature_size " + std::to_string(model_feature_size(run.cfg.model));
  }

  std::string describe_outputs(const RunState& run) const override {
    return std::to_string(run.num_classes) + " classes";
  }

 private:
  // model.feature_cache=host: whether data.patch_size spans the slice
  // plane of every training volume, so that a slice's patches always cut
  // it the same way (PatchSampler: the corner is fixed on an axis where
  // the case is no larger than the patch) and training's slices can hit;
  // said either way.
  bool patches_span_slices(const RunState& run) const;

  std::unique_ptr<PatchSampler> patches_;
  bool train_cached_ = false;  // training's patches carry their origins
};

bool VolumeTask::patches_span_slices(const RunState& run) const {
  const TrainConfig& cfg = run.cfg;
  const DatasetInfo& ti = run.train_data->info();
  const auto& p = cfg.data.patch_size;
  const int64_t axis = cfg.model.slice_axis;
  for (int64_t v = 0; v < ti.num_samples; ++v) {
    const auto& e = ti.volume_shape(v);
    for (int64_t a = 0; a < 3; ++a) {
      if (a == axis || e[a] <= p[a])
        continue;
      log_event(
          detail::concat(
              "model.feature_cache=host: data.patch_size ",
              shape_text({p[0], p[1], p[2]}),
              " does not span the slice plane of training volume ",
              case_key(ti, v),
              " ",
              shape_text({e[0], e[1], e[2]}),
              " (axis ",
              a,
              "), so its patches cut each slice at random places that "
              "rarely meet again: ",
              run.val_data ? "the cache keeps validation's windows only"
                           : "with no data.val the cache keeps nothing "
                             "(set model.feature_cache=none)",
              " (a patch as large as the volumes' slices lets training "
              "hit too)"),
          /*echo=*/run.comm.rank() == 0);
      return false;
    }
  }
  log_event(
      std::string(
          "model.feature_cache=host: data.patch_size spans the slice plane "
          "of every training volume: training's slices are kept and hit "
          "from the second time each is drawn") +
          (run.val_data ? ", validation's from the second validation" : ""),
      /*echo=*/run.comm.rank() == 0);
  return true;
}

Task::CacheNeed VolumeTask::feature_cache_need(const RunState& run) const {
  const TrainConfig& cfg = run.cfg;
  const int64_t axis = cfg.model.slice_axis;
  const int64_t views = context_view(cfg.model).on() ? 2 : 1;
  const bool half = cfg.training.amp != Amp::kOff;
  const auto slice_bytes = [&](const std::array<int64_t, 3>& sides) {
    std::vector<int64_t> ab;
    for (int64_t a = 0; a < 3; ++a) {
      if (a != axis)
        ab.push_back(sides[a]);
    }
    return dinov3_slice_bytes(cfg.model, ab[0], ab[1], half);
  };
  CacheNeed need;
  int64_t train_slices = 0, val_slices = 0;
  if (train_cached_) {
    // Every slice index a patch reaches, in each mirror of the plane.
    const auto& p = cfg.data.patch_size;
    int64_t mirrors = 1;
    for (int64_t a = 0; a < 3; ++a) {
      const bool may =
          cfg.data.flip == Flip::kAll || (cfg.data.flip == Flip::kW && a == 2);
      if (a != axis && may)
        mirrors *= 2;
    }
    const DatasetInfo& ti = run.train_data->info();
    for (int64_t v = 0; v < ti.num_samples; ++v)
      train_slices += mirrors * std::max(ti.volume_shape(v)[axis], p[axis]);
    if (train_slices > 0)
      need.entry_bytes = slice_bytes(p);
  }
  if (run.val_data) {
    // This rank's cases: each window position in the plane, every slice
    // of the padded case across the axis.
    const DatasetInfo& vi = run.val_data->info();
    const auto roi = run.roi();
    for (int64_t v = run.comm.rank(); v < vi.num_samples;
         v += run.comm.size()) {
      const auto& e = vi.volume_shape(v);
      int64_t count = std::max(e[axis], roi[axis]);
      for (int64_t a = 0; a < 3; ++a) {
        if (a != axis) {
          count *= static_cast<int64_t>(
              window_starts(
                  std::max(e[a], roi[a]), roi[a], cfg.validation.overlap)
                  .size());
        }
      }
      val_slices += count;
    }
    if (val_slices > 0)
      need.entry_bytes = std::max(need.entry_bytes, slice_bytes(roi));
  }
  need.entries = (train_slices + val_slices) * views;
  need.how = detail::concat(
      train_slices,
      " training and ",
      val_slices,
      " validation slices (this rank's cases) x ",
      views,
      views == 2 ? " views (patch, context)" : " view",
      ", each slice's ",
      dinov3_spec(cfg.model.variant).layers.size(),
      " feature layers in ",
      half ? "16 bits" : "float32",
      " (",
      need.entry_bytes,
      " B at most)");
  return need;
}

}  // namespace

std::unique_ptr<Task> make_volume_task(const TrainConfig&) {
  return std::make_unique<VolumeTask>();
}

}  // namespace memtrain
