#pragma once
// What a U-Net on data.train's volumes is, for training (the volume task)
// and inference (InferenceModel): its window, its checks, its input.

#include <array>
#include <cstdint>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

struct DatasetInfo;

// The validation window: validation.roi, where 0 the training patch's
// size (data.patch_size).
std::array<int64_t, 3> validation_roi(const TrainConfig& cfg);

// model.in_channels is 0 or the channels of data.train `ti`'s volumes, and
// the training patch and the validation window are multiples of
// unet3d_divisor(model.depth) on every axis. Throws memtrain::Error naming
// the keys.
void check_volume_model(const TrainConfig& cfg, const DatasetInfo& ti);

// Training with training.amp=bf16 on the CPU under LibTorch 2.x: no 3x3x3
// convolution of the model may see a patch depth (the first spatial axis)
// of 2 voxels (unet3d: data.patch_size[0] / 2^l for each level l;
// swin_unetr: / 2^l for l = 0..5). There LibTorch 2.x's CPU (oneDNN)
// bfloat16 convolution computes the weight gradient from uninitialized
// memory: non-finite or silently wrong gradients (Note [A oneDNN bf16
// gradient bug]). Throws memtrain::Error naming the depth and what to set;
// nothing under LibTorch 1.13, on a GPU or with another amp.
void check_cpu_bf16_convolutions(const TrainConfig& cfg, bool on_cpu);

// The model's input: `ti`'s volumes' channels at the training patch's size
// (data.patch_size), `num_classes` outputs.
ModelInput volume_model_input(
    const TrainConfig& cfg, const DatasetInfo& ti, int64_t num_classes);

}  // namespace memtrain
