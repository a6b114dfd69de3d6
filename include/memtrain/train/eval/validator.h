#pragma once
// Validator: whole-volume validation of a segmentation model. Each rank
// takes its share of the validation volumes (volume v goes to rank
// v mod world), one volume at a time: the volume is read into host memory,
// a sliding window runs batches of windows on the device, and the
// probability sum and weight map of the whole volume stay in host memory
// (validation.offload=cpu), so the device peak does not depend on the
// volume's size. Dice and loss are reduced over ranks.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/infer/sliding_window.h"
#include "memtrain/metrics/seg_metrics.h"

namespace memtrain {

class Communicator;
class H5Dataset;
struct DatasetInfo;
class Placement;

struct VolumeValResult {
  // Mean over volumes of (cross-entropy + 1 - mean soft Dice) of the
  // aggregated probabilities, as the training loss but on whole volumes.
  double loss = 0.0;
  // Every volume's hard Dice (argmax) per class, in the file's order, by
  // case_key (Note [One Dice]); val_dice is dice.mean().
  DiceTable dice{1, DiceRule{}};
  int64_t volumes = 0;      // over all ranks
  int64_t sw_batch = 0;     // this rank's windows per batch at the end
  int64_t oom_retries = 0;  // sw_batch halvings on this rank
};

// How records name volume v of a file: its /case_names entry, else its
// index.
std::string case_key(const DatasetInfo& info, int64_t v);

// The most validating one case holds in host memory, bytes: a case of
// `extent` voxels with `channels` input channels, `classes` outputs, the
// window `roi` and `cfg`'s sliding window (validation.sw_batch, offload),
// with `context` crops when on
// -- the largest of its three phases: the sliding window (the case, its
// mask and padded copy, the probability sum and weight map when they live
// on the host, one batch of windows), the crop of a padded sum, and the
// scoring (the loss's temporaries: six tensors of the probabilities'
// size). Note [Host plan] charges it; a test holds it to the measured
// peak.
int64_t case_host_bytes(
    const std::array<int64_t, 3>& extent,
    int64_t channels,
    int64_t classes,
    const std::array<int64_t, 3>& roi,
    const ValidationConfig& cfg,
    const ContextView& context = {});

class Validator {
 public:
  // `roi` is the resolved window (validation.roi, or the training patch);
  // `context`, on, gives each window its context crop (model.context).
  Validator(
      const H5Dataset& data,
      const ValidationConfig& cfg,
      const std::array<int64_t, 3>& roi,
      int64_t num_classes,
      Communicator& comm,
      const Placement& placement,
      ContextView context = {});

  // Collective. `predict` maps a device batch of windows to logits; its
  // third argument is their origins (model/feature_cache.h: kValOrigin,
  // the case, the window's corner), not the sliding window's corners. With an
  // `overlay_dir`, each rank writes there the overlay PNG of every volume it
  // validated (Note [Validation overlays]).
  VolumeValResult run(
      const PatchPredictor& predict, const std::string& overlay_dir = "");

  // The most this rank's share of the cases holds in host memory
  // (case_host_bytes of its largest), and which case that is.
  int64_t host_bytes(int64_t* largest_case = nullptr) const;

  int64_t sw_batch() const {
    return sw_batch_;
  }

 private:
  const H5Dataset& data_;
  ValidationConfig cfg_;
  std::array<int64_t, 3> roi_;
  ContextView context_;
  int64_t num_classes_;
  Communicator& comm_;
  const Placement& placement_;
  int64_t sw_batch_;
};

}  // namespace memtrain
