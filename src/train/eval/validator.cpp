#include "memtrain/train/eval/validator.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "memtrain/data/h5_dataset.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/train/eval/overlay.h"
#include "memtrain/train/eval/seg_metrics.h"
#include "memtrain/train/loop/oom_guard.h"
#include "memtrain/train/tasks/losses.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {

Validator::Validator(
    const H5Dataset& data,
    const ValidationConfig& cfg,
    const std::array<int64_t, 3>& roi,
    int64_t num_classes,
    Communicator& comm,
    const Placement& placement)
    : data_(data),
      cfg_(cfg),
      roi_(roi),
      num_classes_(num_classes),
      comm_(comm),
      placement_(placement),
      sw_batch_(cfg.sw_batch) {
  MT_INTERNAL_ASSERT(
      data.info().kind == SampleKind::kVolumes, "Validator needs volumes");
}

namespace {

struct VolumeScore {
  double loss = 0.0;
  std::vector<double> dice;  // per class; NaN: absent from mask and pred
};

// Scores one volume's aggregated probabilities (K, D, H, W) against its
// mask (D, H, W). Host memory only.
VolumeScore score(const at::Tensor& probs, const at::Tensor& mask, int64_t k) {
  VolumeScore s;
  // The training loss (cross-entropy + 1 - soft Dice) of the averaged
  // probabilities: they go in as log-probabilities (log_softmax of log p
  // is log p), clamped where a class got no probability at all.
  s.loss = dice_ce_loss_sum(
               probs.clamp_min(1e-8).log().unsqueeze(0), mask.unsqueeze(0))
               .item<double>();
  // Hard Dice of the argmax (Note [Dice of an empty class]), from voxel
  // counts per class.
  const at::Tensor pred_1h =
      torch::one_hot(probs.reshape({k, -1}).argmax(0), k);
  const at::Tensor true_1h = torch::one_hot(mask.reshape({-1}), k);
  const at::Tensor both = (pred_1h * true_1h).sum(0).contiguous();
  const at::Tensor pred = pred_1h.sum(0).contiguous();
  const at::Tensor truth = true_1h.sum(0).contiguous();
  for (int64_t c = 0; c < k; ++c) {
    s.dice.push_back(hard_dice(
        both[c].item<int64_t>(),
        pred[c].item<int64_t>(),
        truth[c].item<int64_t>()));
  }
  return s;
}

// Note [Validation overlays]: the middle slice along the first spatial axis
// (D/2 of (C, D, H, W); channel 0), an H x W image, with the label and the
// argmax prediction.
void write_middle_slice(
    const std::string& dir,
    int64_t v,
    const at::Tensor& volume,
    const at::Tensor& mask,
    const at::Tensor& probs) {
  const int64_t d = volume.size(1) / 2;
  const at::Tensor image = volume[0][d].contiguous();
  const at::Tensor label = mask[d].contiguous();
  const at::Tensor pred = probs.select(1, d).argmax(0).cpu().contiguous();
  write_overlay(
      dir,
      v,
      image.data_ptr<float>(),
      label.data_ptr<int64_t>(),
      pred.data_ptr<int64_t>(),
      image.size(0),
      image.size(1));
}

}  // namespace

at::Tensor volume_probs(
    const at::Tensor& volume,
    int64_t num_classes,
    const PatchPredictor& predict,
    const ValidationConfig& cfg,
    const std::array<int64_t, 3>& roi,
    int64_t* sw_batch,
    int rank,
    const std::string& where,
    int64_t* retries,
    const Placement& placement) {
  OomRetry how;
  how.what = "validation.sw_batch";
  how.where = where;
  how.replay = "the volume";
  how.rank = rank;
  how.give_up = [roi](int64_t, int64_t, int64_t peak) {
    return detail::concat(
        "out of device memory in validation even at validation.sw_batch=1 "
        "(window ",
        roi[0],
        "x",
        roi[1],
        "x",
        roi[2],
        ", measured peak ",
        format_bytes(static_cast<double>(peak)),
        "); use a smaller validation.roi or a larger memory.budget");
  };
  at::Tensor probs;
  *retries += retry_on_oom(how, *sw_batch, [&](int64_t b) {
    SlidingWindowOptions opt;
    opt.roi = roi;
    opt.overlap = cfg.overlap;
    opt.sw_batch = b;
    opt.blend = cfg.blend;
    opt.offload_cpu = cfg.offload == Offload::kCpu;
    probs = sliding_window_probs(volume, num_classes, predict, opt, placement);
  });
  return probs;
}

VolumeValResult Validator::run(
    const PatchPredictor& predict, const std::string& overlay_dir) {
  const DatasetInfo& info = data_.info();
  const int64_t k = num_classes_;
  const int rank = comm_.rank();
  const int world = comm_.size();
  VolumeValResult out;
  // [loss sum, volumes, dice sum per class (k), volumes per class (k)]
  std::vector<double> totals(2 + 2 * k, 0.0);
  for (int64_t v = rank; v < info.num_samples; v += world) {
    at::Tensor volume, mask;
    {
      memory::HostScope host;
      const auto& e = info.volume_shape(v);  // the case's own grid
      volume = torch::empty(
          {info.sample_shape[0], e[0], e[1], e[2]}, torch::kFloat32);
      mask = torch::empty({e[0], e[1], e[2]}, torch::kInt64);
      data_.read_volume(v, volume.data_ptr<float>(), mask.data_ptr<int64_t>());
    }
    at::Tensor probs = volume_probs(
        volume,
        k,
        predict,
        cfg_,
        roi_,
        &sw_batch_,
        rank,
        "validation, " + info.volume_name(v),
        &out.oom_retries,
        placement_);
    memory::HostScope host;
    const VolumeScore s = score(probs, mask, k);
    if (!overlay_dir.empty())
      write_middle_slice(overlay_dir, v, volume, mask, probs);
    totals[0] += s.loss;
    totals[1] += 1;
    for (int64_t c = 0; c < k; ++c) {
      if (!std::isnan(s.dice[c])) {
        totals[2 + c] += s.dice[c];
        totals[2 + k + c] += 1;
      }
    }
  }
  at::Tensor t = torch::tensor(totals, torch::kFloat64);
  comm_.all_reduce_sum(t);
  const auto* r = t.data_ptr<double>();
  out.volumes = static_cast<int64_t>(r[1]);
  out.loss = out.volumes > 0 ? r[0] / r[1] : 0.0;
  double fg_sum = 0.0;
  int64_t fg_n = 0;
  for (int64_t c = 0; c < k; ++c) {
    const double d = r[2 + k + c] > 0
                         ? r[2 + c] / r[2 + k + c]
                         : std::numeric_limits<double>::quiet_NaN();
    out.dice_per_class.push_back(d);
    if (c > 0 && !std::isnan(d)) {
      fg_sum += d;
      ++fg_n;
    }
  }
  out.dice =
      fg_n > 0 ? fg_sum / fg_n : std::numeric_limits<double>::quiet_NaN();
  out.sw_batch = sw_batch_;
  return out;
}

}  // namespace memtrain
