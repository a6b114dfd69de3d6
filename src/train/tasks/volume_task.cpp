// Segmentation of volumes: random patches (PatchSampler), Dice +
// cross-entropy per patch, whole-volume validation by sliding window (Note
// [Whole-volume validation]).

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>

#include "memtrain/data/sampling/patch_sampler.h"
#include "memtrain/device/placement.h"
#include "memtrain/input/context_crop.h"
#include "memtrain/metrics/dice_report.h"
#include "memtrain/model/losses.h"
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
    run.source = std::make_unique<PatchSource>(
        *run.train_data, *patches_, &run.train_finite, context);
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
        " [",
        e[0],
        ",",
        e[1],
        ",",
        e[2],
        "], ",
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
        [&run](const at::Tensor& windows, const at::Tensor& context) {
          return forward(run, windows, context);
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
  std::unique_ptr<PatchSampler> patches_;
};

}  // namespace

std::unique_ptr<Task> make_volume_task(const TrainConfig&) {
  return std::make_unique<VolumeTask>();
}

}  // namespace memtrain
