#include "memtrain/model/volume_model.h"

#include "memtrain/compat.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/model/nets/swin_unetr.h"
#include "memtrain/model/nets/unet3d.h"
#include "memtrain/util/error.h"

namespace memtrain {

std::array<int64_t, 3> validation_roi(const TrainConfig& cfg) {
  std::array<int64_t, 3> r = cfg.validation.roi;
  for (int i = 0; i < 3; ++i) {
    if (r[i] == 0)
      r[i] = cfg.data.patch_size[i];
  }
  return r;
}

void check_volume_model(const TrainConfig& cfg, const DatasetInfo& ti) {
  MT_CHECK(
      cfg.model.in_channels == 0 || cfg.model.in_channels == ti.sample_shape[0],
      "model.in_channels=",
      cfg.model.in_channels,
      " but the volumes of data.train '",
      ti.path,
      "' have ",
      ti.sample_shape[0],
      " channel(s); set it to ",
      ti.sample_shape[0],
      " or 0 (from the data)");
  const std::array<int64_t, 3> window = validation_roi(cfg);
  // The U-Net halves the patch depth-1 times, SwinUNETR 5 times, DINOv3
  // cuts the slices across model.slice_axis into 16-pixel patches: check
  // the training patch and the validation window now, not after an epoch.
  const bool swin = cfg.model.name == ModelName::kSwinUnetr;
  const bool dino = cfg.model.name == ModelName::kDinov3;
  const int64_t div = swin   ? kSwinUnetrDivisor
                      : dino ? 16
                             : unet3d_divisor(cfg.model.depth);
  for (int i = 0; i < 3; ++i) {
    if (dino && i == cfg.model.slice_axis)
      continue;
    MT_CHECK(
        cfg.data.patch_size[i] % div == 0 && window[i] % div == 0,
        "data.patch_size=[",
        cfg.data.patch_size[0],
        ", ",
        cfg.data.patch_size[1],
        ", ",
        cfg.data.patch_size[2],
        "] and validation.roi=[",
        window[0],
        ", ",
        window[1],
        ", ",
        window[2],
        "] must be multiples of ",
        div,
        dino ? " on the two axes other than model.slice_axis=" +
                   std::to_string(cfg.model.slice_axis) +
                   ": dinov3 cuts each slice into 16 x 16 patches"
             : std::string(" on every axis: ") +
                   (swin ? "swin_unetr halves them 5 times (MONAI's SwinUNETR)"
                         : "model.depth=" + std::to_string(cfg.model.depth) +
                               " halves them " +
                               std::to_string(cfg.model.depth - 1) +
                               " time(s)"));
  }
  // MONAI's SwinUNETR instance-normalises its 1/32 grid: one voxel there
  // has no statistics (MONAI refuses it; LibTorch would give zeros).
  if (swin) {
    for (const auto* w : {&cfg.data.patch_size, &window}) {
      MT_CHECK(
          (*w)[0] * (*w)[1] * (*w)[2] >
              kSwinUnetrDivisor * kSwinUnetrDivisor * kSwinUnetrDivisor,
          w == &window ? "validation.roi=[" : "data.patch_size=[",
          (*w)[0],
          ", ",
          (*w)[1],
          ", ",
          (*w)[2],
          "] leaves swin_unetr one voxel at 1/32 of it, whose instance norm "
          "has no statistics (MONAI's SwinUNETR refuses it too); make one "
          "axis 64 or more");
    }
  }
}

void check_cpu_bf16_convolutions(const TrainConfig& cfg, bool on_cpu) {
  if (!MEMTRAIN_TORCH_AT_LEAST(2, 0) || !on_cpu ||
      cfg.training.amp != Amp::kBf16 || cfg.model.name == ModelName::kDinov3)
    return;  // (DINOv3 has no 3D convolution)
  const bool swin = cfg.model.name == ModelName::kSwinUnetr;
  const int64_t levels = swin ? 6 : cfg.model.depth;
  const int64_t depth = cfg.data.patch_size[0];
  for (int64_t l = 0; l < levels; ++l) {
    MT_CHECK(
        (depth >> l) != 2,
        "training.amp=bf16 on the CPU: data.patch_size depth ",
        depth,
        " is 2 voxels at 1/",
        int64_t{1} << l,
        " of the patch, where LibTorch 2.x's CPU (oneDNN) bfloat16 3x3x3 "
        "convolution computes the weight gradient from uninitialized memory "
        "(PyTorch 2.11 itself: tests/tools/onednn_bf16_conv3d.py); set "
        "training.amp=off on the CPU, or a patch depth that never halves to "
        "2 (",
        swin ? "96 or 128" : "e.g. 24 or 48",
        ")");
  }
}

ModelInput volume_model_input(
    const TrainConfig& cfg, const DatasetInfo& ti, int64_t num_classes) {
  std::vector<int64_t> shape = {ti.sample_shape.at(0)};
  const auto& p = cfg.data.patch_size;
  shape.insert(shape.end(), p.begin(), p.end());
  return {ti.kind, shape, num_classes, ti.context_features};
}

}  // namespace memtrain
