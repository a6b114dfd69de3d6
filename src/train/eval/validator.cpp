#include "memtrain/train/eval/validator.h"

#include <torch/torch.h>

#include <cmath>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/metrics/overlay.h"
#include "memtrain/metrics/seg_metrics.h"
#include "memtrain/model/feature_cache.h"
#include "memtrain/model/losses.h"
#include "memtrain/util/error.h"
#include "memtrain/util/rank_log.h"

namespace memtrain {

Validator::Validator(
    const H5Dataset& data,
    const ValidationConfig& cfg,
    const std::array<int64_t, 3>& roi,
    int64_t num_classes,
    Communicator& comm,
    const Placement& placement,
    ContextView context)
    : data_(data),
      cfg_(cfg),
      roi_(roi),
      context_(context),
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
  std::vector<DiceCounts> counts;  // per class
};

// Scores one volume's aggregated probabilities (K, D, H, W) against its
// mask (D, H, W). Host memory only.
VolumeScore score(const at::Tensor& probs, const at::Tensor& mask, int64_t k) {
  VolumeScore s;
  // The training loss (cross-entropy + 1 - soft Dice) of the averaged
  // probabilities: they go in as log-probabilities (log_softmax of log p
  // is log p), clamped where a class got no probability at all.
  // (The log in place: a temporary clamp would live to the end of the
  // statement, a seventh tensor of the probabilities' size.)
  at::Tensor log_probs = probs.clamp_min(1e-8);
  log_probs.log_();
  s.loss = dice_ce_loss_sum(log_probs.unsqueeze(0), mask.unsqueeze(0))
               .item<double>();
  log_probs = at::Tensor();
  // Voxel counts per class of the argmax (Note [One Dice]), by counting
  // class indices: one-hot tensors held 3 x K int64 a voxel (a 512^2 x 300
  // case of 14 classes: 24.6 GiB); this holds the argmax (one int64 a
  // voxel), a bool a voxel and the argmax where it is right.
  const at::Tensor pred_class = probs.reshape({k, -1}).argmax(0);
  const at::Tensor truth_class = mask.reshape({-1});
  const at::Tensor both = torch::bincount(
      pred_class.masked_select(pred_class == truth_class), {}, k);
  const at::Tensor pred = torch::bincount(pred_class, {}, k);
  const at::Tensor truth = torch::bincount(truth_class, {}, k);
  for (int64_t c = 0; c < k; ++c) {
    s.counts.push_back(
        {both[c].item<int64_t>(),
         pred[c].item<int64_t>(),
         truth[c].item<int64_t>()});
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

int64_t case_host_bytes(
    const std::array<int64_t, 3>& extent,
    int64_t channels,
    int64_t classes,
    const std::array<int64_t, 3>& roi,
    const ValidationConfig& cfg,
    const ContextView& context) {
  int64_t v = 1, vp = 1, r = 1, windows = 1;
  for (size_t a = 0; a < 3; ++a) {
    const int64_t side = std::max(extent[a], roi[a]);
    v *= extent[a];
    vp *= side;
    r *= roi[a];
    windows *=
        static_cast<int64_t>(window_starts(side, roi[a], cfg.overlap).size());
  }
  const bool padded = vp != v;
  // Every device batch is as large as the first (sliding_window.cpp).
  const int64_t c = channels, k = classes, b = std::min(cfg.sw_batch, windows);
  const int64_t held = 4 * c * v + 8 * v;  // the case and its mask
  // The sliding window: the padded copy, the window weights, a batch of
  // windows gathered and its probabilities back; the sum and weight map on
  // the host (offload cpu), or the sum brought back at the end.
  const int64_t copy = padded ? 4 * c * vp : 0;
  // (The gathered windows go before the predictor runs; its
  // probabilities come back to the host only with the sum there.) With
  // context crops, their batch beside the windows', and while one is cut
  // its padded box, the resize's first pass (at most the box again) and
  // its output (input/context_crop.cpp).
  int64_t gather = 4 * b * c * r;
  if (context.on()) {
    const Box box = context_box({0, 0, 0}, roi, context);
    gather += 4 * b * c * r +
              4 * c * (2 * box.size[0] * box.size[1] * box.size[2] + 2 * r);
  }
  // The batch's window corners and their origins (model/feature_cache.h).
  const int64_t origins = 8 * (3 + kOriginColumns) * b;
  const int64_t window =
      cfg.offload == Offload::kCpu
          ? held + copy + 4 * r + std::max(gather, 4 * b * k * r) +
                4 * (k + 1) * vp + origins
          : held + copy + 4 * r + std::max(gather, 4 * k * vp) + origins;
  // The crop of a padded sum to the case (the padded copy still held).
  const int64_t crop = padded ? held + copy + 4 * k * (vp + v) : 0;
  // score(): the probabilities, their clamped log, and in
  // dice_ce_loss_sum its log-softmax, softmax, one-hot and their product
  // (6 x 4KV), and their per-class sums (4 KiB covers them); the gathered
  // cross-entropy before them and the Dice counts after them hold less.
  const int64_t score = held + 24 * k * v + 4096;
  return std::max({window, crop, score});
}

int64_t Validator::host_bytes(int64_t* largest_case) const {
  const DatasetInfo& info = data_.info();
  int64_t most = 0;
  for (int64_t v = comm_.rank(); v < info.num_samples; v += comm_.size()) {
    const int64_t bytes = case_host_bytes(
        info.volume_shape(v),
        info.sample_shape[0],
        num_classes_,
        roi_,
        cfg_,
        context_);
    if (bytes > most) {
      most = bytes;
      if (largest_case != nullptr)
        *largest_case = v;
    }
  }
  return most;
}

VolumeValResult Validator::run(
    const PatchPredictor& predict, const std::string& overlay_dir) {
  const DatasetInfo& info = data_.info();
  const int64_t k = num_classes_;
  const int rank = comm_.rank();
  const int world = comm_.size();
  const int64_t nv = info.num_samples;
  VolumeValResult out;
  out.dice = DiceTable(k, dice_rule(cfg_));
  // One row per volume: [loss, then per class both, pred, truth]; the rank
  // that validated it fills it, the others leave zeros, so the sum over
  // ranks is every volume's figures exactly (counts are exact in float64).
  const int64_t width = 1 + 3 * k;
  std::vector<double> table(nv * width, 0.0);
  for (int64_t v = rank; v < nv; v += world) {
    at::Tensor volume, mask;
    {
      memory::HostScope host;
      const auto& e = info.volume_shape(v);  // the case's own grid
      volume = torch::empty(
          {info.sample_shape[0], e[0], e[1], e[2]}, torch::kFloat32);
      mask = torch::empty({e[0], e[1], e[2]}, torch::kInt64);
      data_.read_volume(v, volume.data_ptr<float>(), mask.data_ptr<int64_t>());
    }
    const PatchPredictor windows_of_case = [&predict, v](
                                               const at::Tensor& x,
                                               const at::Tensor& context,
                                               const at::Tensor& corners) {
      return predict(x, context, window_origins(kValOrigin, v, corners));
    };
    at::Tensor probs = volume_probs(
        volume,
        k,
        windows_of_case,
        cfg_,
        roi_,
        context_,
        &sw_batch_,
        rank,
        "validation, " + info.volume_name(v),
        &out.oom_retries,
        placement_);
    memory::HostScope host;
    const VolumeScore s = score(probs, mask, k);
    if (!overlay_dir.empty())
      write_middle_slice(overlay_dir, v, volume, mask, probs);
    double* row = table.data() + v * width;
    row[0] = s.loss;
    for (int64_t c = 0; c < k; ++c) {
      row[1 + 3 * c] = static_cast<double>(s.counts[c].both);
      row[2 + 3 * c] = static_cast<double>(s.counts[c].pred);
      row[3 + 3 * c] = static_cast<double>(s.counts[c].truth);
    }
  }
  at::Tensor t =
      torch::from_blob(table.data(), {nv * width}, torch::kFloat64).clone();
  comm_.all_reduce_sum(t);
  const double* all = t.data_ptr<double>();
  // Every rank reduces the same table in the same order: the figures do not
  // depend on the number of ranks.
  double loss_sum = 0.0;
  for (int64_t v = 0; v < nv; ++v) {
    const double* row = all + v * width;
    loss_sum += row[0];
    out.dice.add(case_key(info, v), dice_counts_of(row + 1, k));
  }
  out.volumes = nv;
  out.loss = nv > 0 ? loss_sum / static_cast<double>(nv) : 0.0;
  out.sw_batch = sw_batch_;
  return out;
}

std::string case_key(const DatasetInfo& info, int64_t v) {
  if (v < static_cast<int64_t>(info.case_names.size()) &&
      !info.case_names[v].empty())
    return info.case_names[v];
  return std::to_string(v);
}

}  // namespace memtrain
