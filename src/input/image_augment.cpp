#include "memtrain/input/image_augment.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <utility>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/counter_rng.h"
#include "memtrain/util/error.h"

namespace memtrain {

// Note [Image augmentation]
// A training sample of an /images file is row i of the file (RowSource);
// with data.augment it is transformed on the reader thread that read it,
// in host memory, before the batch is copied to the device:
//   1. crop (crop_flip): torchvision's RandomResizedCrop.get_params --
//      up to 10 attempts of an area fraction s ~ U(scale) and a ratio
//      r = exp(U(log ratio)), w = round(sqrt(s H W r)), h = round(sqrt(s H
//      W / r)) (round half to even, as Python's round), accepted when
//      0 < w <= W and 0 < h <= H, with its corner uniform; else the centre
//      crop of the whole image clamped to the ratio range -- then resized
//      back to H x W by bilinear interpolation (align_corners=false, no
//      antialiasing: upsample_bilinear2d);
//   2. flip (flip, crop_flip): mirrored along W with probability 1/2;
//   3. normalisation (data.normalize imagenet, training and validation):
//      (x - mean[c]) / std[c] with ImageNet's statistics, after the file's
//      own scale and shift (uint8: x / 255).
// Every draw of sample i of epoch e is CounterDraws{sample_key(data.seed,
// kSalt, e, i)}: draws 4a..4a+3 of attempt a are the area fraction, the log
// ratio, the top row and the left column, draw 40 the flip. So a sample's
// augmentation does not depend on the rank that reads it, the thread, the
// micro-batch it is in or the world size, and Note [Window weighting]'s
// promise -- one window, one update, however it is split -- holds with
// augmentation on (tests/e2e/augment.sh compares 1 and 2 ranks). Each
// sample is interpolated by itself, so its pixels do not depend on the
// other samples of its batch either.

namespace {

constexpr uint64_t kSalt = 0x6a09e667f3bcc909ULL;  // this stream's own
constexpr int kAttempts = 10;
constexpr uint64_t kFlipDraw = 4 * kAttempts;

std::string list(const std::array<double, 2>& v) {
  std::ostringstream out;
  out << "[" << v[0] << ", " << v[1] << "]";
  return out.str();
}

}  // namespace

std::string ImageTransform::describe() const {
  std::string s = crop && flip ? "crop_flip"
                  : flip       ? "flip"
                  : crop       ? "crop"
                               : "none";
  if (crop)
    s += " (scale " + list(scale) + ", ratio " + list(ratio) + ")";
  return s + ", normalize " +
         (normalize_clip ? "clip"
          : normalize    ? "imagenet"
                         : "none");
}

CropDraw draw_crop(
    const ImageTransform& t,
    int64_t height,
    int64_t width,
    int64_t epoch,
    int64_t index) {
  const CounterDraws d{sample_key(t.seed, kSalt, epoch, index)};
  CropDraw r;
  r.height = height;
  r.width = width;
  r.flip = t.flip && d.unit(kFlipDraw) < 0.5;
  if (!t.crop)
    return r;
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(t.ratio[0]), log_hi = std::log(t.ratio[1]);
  for (uint64_t a = 0; a < kAttempts; ++a) {
    const double target =
        area * (t.scale[0] + d.unit(4 * a) * (t.scale[1] - t.scale[0]));
    const double aspect =
        std::exp(log_lo + d.unit(4 * a + 1) * (log_hi - log_lo));
    const auto w =
        static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
    const auto h =
        static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      r.top = d.below(4 * a + 2, height - h + 1);
      r.left = d.below(4 * a + 3, width - w + 1);
      r.height = h;
      r.width = w;
      return r;
    }
  }
  // The centre crop, clamped to the ratio range.
  const double in_ratio =
      static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < t.ratio[0]) {
    h = static_cast<int64_t>(std::nearbyint(w / t.ratio[0]));
  } else if (in_ratio > t.ratio[1]) {
    w = static_cast<int64_t>(std::nearbyint(h * t.ratio[1]));
  }
  r.top = (height - h) / 2;
  r.left = (width - w) / 2;
  r.height = h;
  r.width = w;
  return r;
}

at::Tensor crop_and_flip(const at::Tensor& x, const CropDraw& d) {
  MT_INTERNAL_ASSERT(x.dim() == 3, "crop_and_flip: x must be (C, H, W)");
  const int64_t height = x.size(1), width = x.size(2);
  MT_INTERNAL_ASSERT(
      d.top >= 0 && d.left >= 0 && d.height > 0 && d.width > 0 &&
          d.top + d.height <= height && d.left + d.width <= width,
      "crop_and_flip: the box is outside the image");
  at::Tensor out = x.narrow(1, d.top, d.height).narrow(2, d.left, d.width);
  if (d.height != height || d.width != width) {
    const std::array<int64_t, 2> size{height, width};
    out = at::upsample_bilinear2d(
              out.unsqueeze(0),
              at::IntArrayRef(size),
              /*align_corners=*/false,
              c10::nullopt,
              c10::nullopt)
              .squeeze(0);
  }
  if (d.flip)
    out = out.flip({2});
  return out.contiguous();
}

void normalize_channels(
    at::Tensor& x,
    const std::array<double, 3>& mean,
    const std::array<double, 3>& std) {
  MT_INTERNAL_ASSERT(
      x.dim() >= 3 && x.size(-3) == 3, "normalize_channels: not 3 channels");
  const auto opts = x.options();
  x.sub_(torch::tensor({mean[0], mean[1], mean[2]}, opts).view({3, 1, 1}))
      .div_(torch::tensor({std[0], std[1], std[2]}, opts).view({3, 1, 1}));
}

void transform_images(
    const ImageTransform& t,
    int64_t epoch,
    const std::vector<int64_t>& ids,
    at::Tensor& x) {
  if (t.augments()) {
    const int64_t height = x.size(2), width = x.size(3);
    for (size_t k = 0; k < ids.size(); ++k) {
      const CropDraw d = draw_crop(t, height, width, epoch, ids[k]);
      if (d.height == height && d.width == width && !d.flip)
        continue;  // the sample as stored
      at::Tensor xk = x[static_cast<int64_t>(k)];
      xk.copy_(crop_and_flip(xk, d));
    }
  }
  if (t.normalize_clip)
    normalize_channels(x, kClipMean, kClipStd);
  else if (t.normalize)
    normalize_imagenet(x);
}

ImageTransforms resolve_image_transforms(
    const TrainConfig& cfg, const DatasetInfo& info, bool episodes_or_pairs) {
  const DataConfig& data = cfg.data;
  const bool images = info.kind == SampleKind::kImages;
  const ModelRow& model = model_row(cfg.model.name);
  const int64_t channels = images ? info.sample_shape.at(0) : 0;
  const std::string where = "data.train '" + info.path + "'";
  const Augment augment =
      data.augment != Augment::kAuto ? data.augment
      : model.imagenet_images && images && !episodes_or_pairs
          ? Augment::kCropFlip
          : Augment::kNone;
  const Normalize normalize =
      data.normalize != Normalize::kAuto             ? data.normalize
      : model.clip_images && images && channels == 3 ? Normalize::kClip
      : model.imagenet_images && images && channels == 3 && !episodes_or_pairs
          ? Normalize::kImagenet
          : Normalize::kNone;
  // A transform that is on must have images trained as rows to act on.
  const auto check_applies =
      [&](const char* key, const char* value, bool clip_pairs_ok) {
        MT_CHECK(
            images,
            key,
            "=",
            value,
            " applies to /images files, but ",
            where,
            " holds ",
            info.paired ? "pairs of " : "",
            to_string(info.kind),
            "; set ",
            key,
            "=none (or auto)");
        MT_CHECK(
            !episodes_or_pairs ||
                (clip_pairs_ok && model.clip_images && info.paired),
            key,
            "=",
            value,
            " applies to images trained as rows; ",
            where,
            " is read as ",
            info.paired ? "pairs (model.name=dual_encoder)"
                        : "few-shot episodes (data.episodes.n_way > 0)",
            ", which are not augmented or normalised (model.name=clip's "
            "images are normalised); set ",
            key,
            "=none (or auto)");
      };
  if (augment != Augment::kNone)
    check_applies("data.augment", to_string(augment), false);
  if (normalize != Normalize::kNone)
    check_applies("data.normalize", to_string(normalize), true);
  MT_CHECK(
      normalize == Normalize::kNone || channels == 3,
      "data.normalize=",
      to_string(normalize),
      " needs 3-channel (RGB) images, but the images of ",
      where,
      " have ",
      channels,
      " channel(s); set data.normalize=none (or auto)");
  ImageTransforms r;
  r.train.crop = augment == Augment::kCropFlip;
  r.train.flip = augment == Augment::kCropFlip || augment == Augment::kFlip;
  r.train.scale = data.crop_scale;
  r.train.ratio = data.crop_ratio;
  r.train.normalize = normalize != Normalize::kNone;
  r.train.normalize_clip = normalize == Normalize::kClip;
  r.train.seed = static_cast<uint64_t>(data.seed);
  r.val.normalize = r.train.normalize;
  r.val.normalize_clip = r.train.normalize_clip;
  r.val.seed = r.train.seed;
  return r;
}

}  // namespace memtrain
