#pragma once
// Per-sample image augmentation and normalisation of /images rows (Note
// [Image augmentation] in src/input/image_augment.cpp): torchvision's
// RandomResizedCrop (back to the stored H x W, bilinear) and
// RandomHorizontalFlip for training samples, then ImageNet's per-channel
// normalisation for training and validation samples. Each sample's draws
// come from (data.seed, epoch, sample index) alone. Runs in RowSource::read,
// on the prefetcher's reader threads, in host memory.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace memtrain {

struct DatasetInfo;
struct TrainConfig;

// What is done to each sample of a batch of /images rows.
struct ImageTransform {
  bool crop = false;  // random resized crop (torchvision's get_params)
  bool flip = false;  // horizontal flip with probability 1/2
  std::array<double, 2> scale{0.08, 1.0};        // crop area / image area
  std::array<double, 2> ratio{0.75, 4.0 / 3.0};  // crop width / height
  // (x - mean) / std per channel: ImageNet's statistics, or CLIP's
  // (normalize_clip: data.normalize=clip).
  bool normalize = false;
  bool normalize_clip = false;
  uint64_t seed = 0;  // data.seed

  bool augments() const {
    return crop || flip;
  }
  bool active() const {
    return crop || flip || normalize;
  }
  // "crop_flip, normalize imagenet", for the banner.
  std::string describe() const;
};

// ImageNet's channel statistics (torchvision's, timm's IMAGENET_DEFAULT_*).
constexpr std::array<double, 3> kImagenetMean{0.485, 0.456, 0.406};
constexpr std::array<double, 3> kImagenetStd{0.229, 0.224, 0.225};
// OpenAI CLIP's (open_clip's OPENAI_DATASET_MEAN / _STD), which its ViTs
// were trained with.
constexpr std::array<double, 3> kClipMean{0.48145466, 0.4578275, 0.40821073};
constexpr std::array<double, 3> kClipStd{0.26862954, 0.26130258, 0.27577711};

// One sample's draw: the crop box in the stored image (rows top..top+height,
// columns left..left+width) and whether it is mirrored.
struct CropDraw {
  int64_t top = 0;
  int64_t left = 0;
  int64_t height = 0;
  int64_t width = 0;
  bool flip = false;
  bool operator==(const CropDraw& o) const {
    return top == o.top && left == o.left && height == o.height &&
           width == o.width && flip == o.flip;
  }
};

// The draw of sample `index` of `epoch` for an image of `height` x `width`:
// a pure function of (t.seed, epoch, index) and the image size. Without
// t.crop the box is the whole image; without t.flip no mirroring.
CropDraw draw_crop(
    const ImageTransform& t,
    int64_t height,
    int64_t width,
    int64_t epoch,
    int64_t index);

// x (C, H, W) float32: the box of `d` resized back to H x W (bilinear,
// align_corners=false, no antialiasing; the box itself when it is the
// whole image), mirrored along W when d.flip. Returns a new tensor.
at::Tensor crop_and_flip(const at::Tensor& x, const CropDraw& d);

// In place: x (..., 3, H, W) float32 becomes (x - mean[c]) / std[c].
void normalize_channels(
    at::Tensor& x,
    const std::array<double, 3>& mean,
    const std::array<double, 3>& std);
inline void normalize_imagenet(at::Tensor& x) {
  normalize_channels(x, kImagenetMean, kImagenetStd);
}

// The training and validation transforms of `cfg` for the rows of `info`
// (data.augment, data.crop_scale, data.crop_ratio, data.normalize with
// their auto rules, docs/models.md "Images"); `episodes_or_pairs`: rows that
// are read as episodes or pairs, which get none -- except CLIP's normalisation
// of model.name=clip's images (auto there). Throws memtrain::Error for a
// transform the file cannot take (not /images; imagenet or clip on images
// without 3 channels; augmentation of episodes or pairs).
struct ImageTransforms {
  ImageTransform train;
  ImageTransform val;  // normalisation only
};
ImageTransforms resolve_image_transforms(
    const TrainConfig& cfg, const DatasetInfo& info, bool episodes_or_pairs);

// Applies `t` to the batch x (n, C, H, W) float32 of samples `ids` of
// `epoch`, in place (host memory).
void transform_images(
    const ImageTransform& t,
    int64_t epoch,
    const std::vector<int64_t>& ids,
    at::Tensor& x);

}  // namespace memtrain
