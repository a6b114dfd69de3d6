#pragma once
// A segmentation model loaded for inference (`memtrain predict`): the
// training config's U-Net, sized by data.train's header, on one device,
// with its weights loaded strictly by name, in eval mode for good. No
// optimizer, gradient buckets, sampler, reader threads or communicator:
// each rank holds its own and predicts its own cases.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"

namespace memtrain {

class Placement;

// What the model was trained on: data.train's header, opened once.
struct TrainedOn {
  DatasetInfo data;         // channels, spacing_mm, orientation
  int64_t num_classes = 0;  // the model's outputs
};

// Opens data.train's header and checks that `cfg` segments it:
// model.name=unet3d on volumes, the channels, classes and windows of
// check_volume_model. `cmd` (e.g. "predict") names the command in the
// model.name refusal. Throws memtrain::Error.
TrainedOn trained_on(const TrainConfig& cfg, const std::string& cmd);

class InferenceModel {
 public:
  // Within memory.budget on `placement` (start_on_device, as a training
  // run), builds the model for `on`; its parameters are model.seed's until
  // load_weights. `cfg` and `placement` must outlive it.
  InferenceModel(
      const TrainConfig& cfg, const TrainedOn& on, const Placement& placement);
  ~InferenceModel();
  InferenceModel(const InferenceModel&) = delete;
  InferenceModel& operator=(const InferenceModel&) = delete;

  // Every parameter and buffer from the safetensors file `path` by name,
  // strictly (load_weights_file; `what` names it in messages).
  void load_weights(const std::string& path, const std::string& what);

  const TrainedOn& trained_on() const;
  // The run's config (validation's window and Dice rule).
  const TrainConfig& config() const;

  // The class probabilities (K, D, H, W), host memory, of one volume
  // ((C, D, H, W) float32, host memory, normalised as the training data)
  // by the validator's sliding window (volume_probs: validation.roi,
  // overlap, sw_batch, blend, offload) under training.amp's autocast.
  // Out of device memory, validation.sw_batch is halved and the volume
  // run again; the halved value is kept for the next volumes. `where`
  // names the volume in messages; `rank` is this process's.
  at::Tensor predict_volume(
      const at::Tensor& volume, const std::string& where, int rank);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memtrain
