#include "memtrain/train/eval/validator.h"

#include <torch/torch.h>

#include <cmath>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/dist/communicator.h"
#include "memtrain/memory/device_memory.h"
#include "memtrain/memory/oom_guard.h"
#include "memtrain/metrics/overlay.h"
#include "memtrain/metrics/seg_metrics.h"
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
  std::vector<DiceCounts> counts;  // per class
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
  // Voxel counts per class of the argmax (Note [One Dice]).
  const at::Tensor pred_1h =
      torch::one_hot(probs.reshape({k, -1}).argmax(0), k);
  const at::Tensor true_1h = torch::one_hot(mask.reshape({-1}), k);
  const at::Tensor both = (pred_1h * true_1h).sum(0).contiguous();
  const at::Tensor pred = pred_1h.sum(0).contiguous();
  const at::Tensor truth = true_1h.sum(0).contiguous();
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
