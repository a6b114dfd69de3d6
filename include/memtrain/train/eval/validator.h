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

class Validator {
 public:
  // `roi` is the resolved window (validation.roi, or the training patch).
  Validator(
      const H5Dataset& data,
      const ValidationConfig& cfg,
      const std::array<int64_t, 3>& roi,
      int64_t num_classes,
      Communicator& comm,
      const Placement& placement);

  // Collective. `predict` maps a device batch of windows to logits. With an
  // `overlay_dir`, each rank writes there the overlay PNG of every volume it
  // validated (Note [Validation overlays]).
  VolumeValResult run(
      const PatchPredictor& predict, const std::string& overlay_dir = "");

  int64_t sw_batch() const {
    return sw_batch_;
  }

 private:
  const H5Dataset& data_;
  ValidationConfig cfg_;
  std::array<int64_t, 3> roi_;
  int64_t num_classes_;
  Communicator& comm_;
  const Placement& placement_;
  int64_t sw_batch_;
};

}  // namespace memtrain
