#include "memtrain/config/train_config.h"

#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include "memtrain/config/memory_size.h"
#include "memtrain/util/error.h"
#include "memtrain/util/file_kind.h"

namespace memtrain {
namespace {

// One configurable key: its dotted name, how to parse and check a value, and
// where it lives in a TrainConfig. The table below is the single source of
// truth for parsing, defaults, `--help` and the resolved YAML.
struct Key {
  enum class Type {
    kInt,
    kFloat,
    kBool,
    kString,
    kChoice,
    kInt3,
    kClasses,
    kStrings,
    kFloat2,
    kBudget
  };
  std::string name;
  Type type = Type::kString;
  std::string help;
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  bool min_exclusive = false;
  bool max_exclusive = false;  // floats: the range is [min, max)
  bool allow_auto = false;     // integers: "auto" means kAuto
  bool allow_empty = false;    // strings: "" is a value (none, skip)
  std::vector<std::string> choices;
  // Accessors into a config (exactly one is set, by type).
  std::function<int64_t*(TrainConfig&)> i;
  std::function<double*(TrainConfig&)> f;
  std::function<bool*(TrainConfig&)> b;
  std::function<std::string*(TrainConfig&)> s;
  std::function<std::array<int64_t, 3>*(TrainConfig&)> t;
  std::function<ClassChoice*(TrainConfig&)> c;
  std::function<std::vector<std::string>*(TrainConfig&)> l;
  std::function<std::array<double, 2>*(TrainConfig&)> r;
  std::function<BudgetSpec*(TrainConfig&)> m;
  // kChoice: the value's spelling, and parse-and-set (false: not a choice).
  std::function<const char*(TrainConfig&)> get_choice;
  std::function<bool(TrainConfig&, const std::string&)> set_choice;
};

Key int_key(
    std::string name,
    std::function<int64_t*(TrainConfig&)> at,
    double min,
    double max,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kInt;
  k.help = std::move(help);
  k.min = min;
  k.max = max;
  k.i = std::move(at);
  return k;
}

Key auto_int_key(
    std::string name,
    std::function<int64_t*(TrainConfig&)> at,
    double min,
    double max,
    std::string help) {
  Key k = int_key(std::move(name), std::move(at), min, max, std::move(help));
  k.allow_auto = true;
  return k;
}

Key float_key(
    std::string name,
    std::function<double*(TrainConfig&)> at,
    double min,
    bool min_exclusive,
    double max,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kFloat;
  k.help = std::move(help);
  k.min = min;
  k.min_exclusive = min_exclusive;
  k.max = max;
  k.f = std::move(at);
  return k;
}

Key bool_key(
    std::string name, std::function<bool*(TrainConfig&)> at, std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kBool;
  k.help = std::move(help);
  k.b = std::move(at);
  return k;
}

Key string_key(
    std::string name,
    std::function<std::string*(TrainConfig&)> at,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kString;
  k.help = std::move(help);
  k.s = std::move(at);
  return k;
}

// memory.budget: parsed into a BudgetSpec where it is read.
Key budget_key(
    std::string name,
    std::function<BudgetSpec*(TrainConfig&)> at,
    std::string help) {
  Key k = string_key(std::move(name), nullptr, std::move(help));
  k.type = Key::Type::kBudget;
  k.m = std::move(at);
  return k;
}

// A string for which "" means something (none, skip, the defaults); any
// other string key refuses an empty value (`--memory.budget=` is a typo, not
// "none").
Key optional_string_key(
    std::string name,
    std::function<std::string*(TrainConfig&)> at,
    std::string help) {
  Key k = string_key(std::move(name), std::move(at), std::move(help));
  k.allow_empty = true;
  return k;
}

// A choice key: the value is parsed once, here, into the enum E; its
// spellings (choices.h) are the allowed values, in `--help`'s order.
template <class At>
Key choice_key(std::string name, At at, std::string help) {
  using E = std::remove_pointer_t<std::invoke_result_t<At, TrainConfig&>>;
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kChoice;
  k.help = std::move(help);
  for (const char* spelling : choice_names(E{}))
    k.choices.emplace_back(spelling);
  k.get_choice = [at](TrainConfig& c) { return to_string(*at(c)); };
  k.set_choice = [at](TrainConfig& c, const std::string& text) {
    const std::optional<E> v = parse_choice<E>(text);
    if (v)
      *at(c) = *v;
    return v.has_value();
  };
  return k;
}

// Three integers [D, H, W]; one integer n means [n, n, n].
Key int3_key(
    std::string name,
    std::function<std::array<int64_t, 3>*(TrainConfig&)> at,
    double min,
    double max,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kInt3;
  k.help = std::move(help);
  k.min = min;
  k.max = max;
  k.t = std::move(at);
  return k;
}

// A list of class ids, or a fraction in (0, 1).
Key classes_key(
    std::string name,
    std::function<ClassChoice*(TrainConfig&)> at,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kClasses;
  k.help = std::move(help);
  k.c = std::move(at);
  return k;
}

// A list [a, b, ...] of strings (a single string is a list of one).
Key strings_key(
    std::string name,
    std::function<std::vector<std::string>*(TrainConfig&)> at,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kStrings;
  k.help = std::move(help);
  k.l = std::move(at);
  return k;
}

// A range [lo, hi] of two numbers, min < lo <= hi <= max (min exclusive).
Key range_key(
    std::string name,
    std::function<std::array<double, 2>*(TrainConfig&)> at,
    double min,
    double max,
    std::string help) {
  Key k;
  k.name = std::move(name);
  k.type = Key::Type::kFloat2;
  k.help = std::move(help);
  k.min = min;
  k.min_exclusive = true;
  k.max = max;
  k.r = std::move(at);
  return k;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

const std::vector<Key>& keys() {
  static const std::vector<Key> table = {
      choice_key(
          "model.name",
          [](TrainConfig& c) { return &c.model.name; },
          "model: mlp (for /features files), cnn, resnet50 or "
          "seresnext50_32x4d (for /images; the ResNets are timm's, with "
          "timm's tensor names and batch-norm), unet3d or swin_unetr "
          "(MONAI's SwinUNETR, its tensor names) (for /volumes) or "
          "dual_encoder (for pair files: two towers, symmetric InfoNCE) or "
          "clip (for pair files of /images and /tokens: open_clip's ViT "
          "and text transformer, its tensor names; model.variant)"),
      string_key(
          "model.variant",
          [](TrainConfig& c) { return &c.model.variant; },
          "clip: open_clip's model config, ViT-B-32 or ViT-B-16 (image and "
          "text towers of width 768 and 512, 12 layers each, embeddings "
          "512), or tiny (2 layers of width 64 each, embeddings 32: for "
          "tests); a -quickgelu suffix selects QuickGELU (OpenAI's "
          "weights); the image size and context length are the data's"),
      int_key(
          "model.hidden",
          [](TrainConfig& c) { return &c.model.hidden; },
          1,
          1 << 16,
          "hidden width (MLP units, CNN channels)"),
      choice_key(
          "model.norm",
          [](TrainConfig& c) { return &c.model.norm; },
          "normalisation layers of mlp, cnn, unet3d: none, group, or "
          "instance (unet3d); no batch-norm there: it would make the "
          "update depend on the micro-batch split (the ResNets have "
          "batch-norm, as timm's)"),
      int_key(
          "model.depth",
          [](TrainConfig& c) { return &c.model.depth; },
          1,
          256,
          "MLP residual blocks / CNN stages / U-Net levels; each is a "
          "checkpoint segment (a U-Net level is two)"),
      auto_int_key(
          "model.feature_size",
          [](TrainConfig& c) { return &c.model.feature_size; },
          1,
          4096,
          "unet3d: channels of the first level (doubling per level; auto: "
          "16); swin_unetr: MONAI's feature_size, a multiple of 12 (auto: "
          "48)"),
      int_key(
          "model.in_channels",
          [](TrainConfig& c) { return &c.model.in_channels; },
          0,
          4096,
          "unet3d: input channels (0: the data's C); must match the data"),
      int_key(
          "model.num_classes",
          [](TrainConfig& c) { return &c.model.num_classes; },
          0,
          1 << 20,
          "output classes (0: the training file's num_classes); must be "
          "at least that; 1: a binary classifier (labels 0 and 1, one "
          "logit, sigmoid + binary cross-entropy, val_auc)"),
      float_key(
          "model.dropout",
          [](TrainConfig& c) { return &c.model.dropout; },
          0,
          false,
          0.95,
          "dropout probability in the MLP's blocks"),
      int_key(
          "model.seed",
          [](TrainConfig& c) { return &c.model.seed; },
          0,
          9.0e15,
          "seed of the parameter initialisation"),
      choice_key(
          "model.head",
          [](TrainConfig& c) { return &c.model.head; },
          "linear: one output per class; prototype / cosine (few-shot, "
          "with data.episodes): logits = -squared distance / s x cosine "
          "to the episode's class prototypes (mean support embeddings); "
          "cosine_transformer: FS-CT, the prototypes attend to each query "
          "through cosine attention (model.fsct.*)"),
      int_key(
          "model.embed_dim",
          [](TrainConfig& c) { return &c.model.embed_dim; },
          2,
          1 << 16,
          "few-shot heads, dual_encoder: width of the embedding (the "
          "backbone's or each tower's outputs)"),
      float_key(
          "model.init_temperature",
          [](TrainConfig& c) { return &c.model.init_temperature; },
          0,
          true,
          kInf,
          "dual_encoder, clip: the softmax temperature to start from (logit "
          "scale "
          "log(1/T), learnable, clamped to [0, log 100] after each step as "
          "CLIP does)"),
      float_key(
          "model.cosine_scale",
          [](TrainConfig& c) { return &c.model.cosine_scale; },
          0,
          true,
          kInf,
          "cosine: initial value of the learnable logit scale s"),
      int_key(
          "model.fsct.heads",
          [](TrainConfig& c) { return &c.model.fsct.heads; },
          1,
          1024,
          "cosine_transformer: attention heads (the paper's 8)"),
      int_key(
          "model.fsct.dim_head",
          [](TrainConfig& c) { return &c.model.fsct.dim_head; },
          1,
          1 << 16,
          "cosine_transformer: width of each attention head and of the "
          "layer before the cosine output layer (the paper's 64)"),
      int_key(
          "model.fsct.mlp_dim",
          [](TrainConfig& c) { return &c.model.fsct.mlp_dim; },
          1,
          1 << 20,
          "cosine_transformer: hidden width of the feed-forward block (the "
          "paper's 512)"),
      int_key(
          "model.fsct.depth",
          [](TrainConfig& c) { return &c.model.fsct.depth; },
          1,
          64,
          "cosine_transformer: times the attention and feed-forward blocks "
          "(one set of weights, as the official code) are applied (the "
          "paper's 1)"),
      optional_string_key(
          "model.pretrained",
          [](TrainConfig& c) { return &c.model.pretrained; },
          "a safetensors file, or a torch.save file (.pt/.pth) holding a "
          "state dict (at its top or under 'state_dict', 'model', ...), whose "
          "tensors are loaded by name (and shape) before training, on every "
          "rank; \"\" for none; not on resume (the checkpoint wins)"),
      bool_key(
          "model.pretrained_strict",
          [](TrainConfig& c) { return &c.model.pretrained_strict; },
          "true: a tensor of model.pretrained missing, unexpected or of "
          "another shape stops the run (exit 2) naming it; false: load what "
          "matches, report the rest, keep model.seed's values for it (a "
          "new head)"),
      strings_key(
          "model.pretrained_rename",
          [](TrainConfig& c) { return &c.model.pretrained_rename; },
          "rules 'REGEX -> REPLACEMENT' renaming model.pretrained's names "
          "before they are matched, in order, each replacing every match "
          "($1 for a group): ['^module\\. -> '] drops DataParallel's "
          "prefix; a rule matching no name stops the run"),
      strings_key(
          "model.freeze",
          [](TrainConfig& c) { return &c.model.freeze; },
          "name prefixes ([conv1, bn1, layer1]) of parameters that do not "
          "train: no gradient, no optimizer state, not all-reduced; their "
          "batch-norms use their running statistics; a prefix matching "
          "no parameter is an error"),
      bool_key(
          "model.sync_bn",
          [](TrainConfig& c) { return &c.model.sync_bn; },
          "resnet50, seresnext50_32x4d: false: batch-norm uses each "
          "micro-batch's own statistics (as PyTorch DDP); true: those of "
          "every rank's concurrent micro-batch (as SyncBatchNorm; two small "
          "all-reduces per batch-norm per micro-step; no OOM replay)"),
      choice_key(
          "model.channels_last",
          [](TrainConfig& c) { return &c.model.channels_last; },
          "cnn, resnet50, seresnext50_32x4d: convolution weights and "
          "images in channels-last (NHWC) memory order, the layout NVIDIA "
          "recommends for cuDNN's tensor-core convolutions (auto: on a "
          "CUDA device; on a CPU it only changes the rounding)"),
      string_key(
          "data.train",
          [](TrainConfig& c) { return &c.data.train; },
          "training HDF5 file (see docs/data-format.md)"),
      optional_string_key(
          "data.val",
          [](TrainConfig& c) { return &c.data.val; },
          "validation HDF5 file; empty to skip validation"),
      optional_string_key(
          "data.stage_dir",
          [](TrainConfig& c) { return &c.data.stage_dir; },
          "a node-local folder (a local disk, $TMPDIR) where each node "
          "copies data.train and data.val before training and reads them "
          "from (a later run finds the copies there); empty: read them "
          "where they are"),
      auto_int_key(
          "data.batch_size",
          [](TrainConfig& c) { return &c.data.batch_size; },
          1,
          1 << 20,
          "micro-batch per rank (samples in one forward/backward); auto: "
          "the largest that fits memory.budget (needs "
          "training.effective_batch_size)"),
      int_key(
          "data.val_batch_size",
          [](TrainConfig& c) { return &c.data.val_batch_size; },
          0,
          1 << 20,
          "validation batch per rank (0: the training micro-batch); halved "
          "on out-of-memory"),
      int_key(
          "data.seed",
          [](TrainConfig& c) { return &c.data.seed; },
          0,
          9.0e15,
          "seed of the per-epoch sample permutation"),
      bool_key(
          "data.drop_last",
          [](TrainConfig& c) { return &c.data.drop_last; },
          "drop each epoch's last, partial window"),
      int3_key(
          "data.patch_size",
          [](TrainConfig& c) { return &c.data.patch_size; },
          1,
          1 << 16,
          "volumes: training patch [D, H, W] in voxels (one number: a "
          "cube); read by hyperslab, never the whole volume"),
      int_key(
          "data.patches_per_volume",
          [](TrainConfig& c) { return &c.data.patches_per_volume; },
          1,
          1 << 24,
          "volumes: training patches per volume per epoch"),
      float_key(
          "data.pos_fraction",
          [](TrainConfig& c) { return &c.data.pos_fraction; },
          0,
          false,
          1,
          "volumes: fraction of patches centred on a foreground voxel "
          "(mask > 0); the rest anywhere"),
      choice_key(
          "data.flip",
          [](TrainConfig& c) { return &c.data.flip; },
          "volumes: mirror training patches, each allowed axis with "
          "probability 1/2: w = the W axis (left-right in convert-nifti "
          "files), all = every axis"),
      float_key(
          "data.intensity_scale",
          [](TrainConfig& c) { return &c.data.intensity_scale; },
          -1e30,
          false,
          1e30,
          "volumes: x = raw * scale + shift; 0: the /volumes attributes "
          "scale and shift (or none)"),
      float_key(
          "data.intensity_shift",
          [](TrainConfig& c) { return &c.data.intensity_shift; },
          -1e30,
          false,
          1e30,
          "volumes: see data.intensity_scale"),
      int_key(
          "data.prefetch",
          [](TrainConfig& c) { return &c.data.prefetch; },
          0,
          1024,
          "micro-batches read ahead on background threads (0: read when "
          "needed, on the training thread)"),
      int_key(
          "data.read_threads",
          [](TrainConfig& c) { return &c.data.read_threads; },
          1,
          64,
          "background reader threads (with data.prefetch > 0)"),
      choice_key(
          "data.augment",
          [](TrainConfig& c) { return &c.data.augment; },
          "/images training samples, on the reader threads, drawn from "
          "(data.seed, epoch, sample) alone: crop_flip = random resized "
          "crop (torchvision's RandomResizedCrop, back to the stored H x W, "
          "bilinear) then horizontal flip (p 1/2); flip = the flip only; "
          "auto: crop_flip for resnet50 and seresnext50_32x4d, none "
          "otherwise"),
      range_key(
          "data.crop_scale",
          [](TrainConfig& c) { return &c.data.crop_scale; },
          0,
          1,
          "crop_flip: [lo, hi] range of the crop's area as a fraction of "
          "the image's"),
      range_key(
          "data.crop_ratio",
          [](TrainConfig& c) { return &c.data.crop_ratio; },
          0,
          kInf,
          "crop_flip: [lo, hi] range of the crop's aspect ratio (width / "
          "height), drawn log-uniformly"),
      choice_key(
          "data.normalize",
          [](TrainConfig& c) { return &c.data.normalize; },
          "/images training and validation samples: imagenet = (x - mean) "
          "/ std per channel with ImageNet's mean (0.485, 0.456, 0.406) "
          "and std (0.229, 0.224, 0.225), after the file's scale (uint8: "
          "x / 255); clip = the same with OpenAI CLIP's mean (0.48145466, "
          "0.4578275, 0.40821073) and std (0.26862954, 0.26130258, "
          "0.27577711); each needs 3 channels; auto: imagenet for resnet50 "
          "and seresnext50_32x4d on 3-channel images, clip for "
          "model.name=clip, none otherwise"),
      int_key(
          "data.episodes.n_way",
          [](TrainConfig& c) { return &c.data.episodes.n_way; },
          0,
          1 << 16,
          "few-shot: classes per episode (0: no episodes, train on rows); "
          "a sample, a micro-batch's unit, is then a whole episode"),
      int_key(
          "data.episodes.k_shot",
          [](TrainConfig& c) { return &c.data.episodes.k_shot; },
          1,
          1 << 16,
          "few-shot: support samples per class"),
      int_key(
          "data.episodes.n_query",
          [](TrainConfig& c) { return &c.data.episodes.n_query; },
          1,
          1 << 16,
          "few-shot: query samples per class (the loss is their mean "
          "cross-entropy; fewer queries, less activation memory)"),
      int_key(
          "data.episodes.per_epoch",
          [](TrainConfig& c) { return &c.data.episodes.per_epoch; },
          1,
          1 << 30,
          "few-shot: training episodes per epoch"),
      classes_key(
          "data.val_classes",
          [](TrainConfig& c) { return &c.data.val_classes; },
          "few-shot: classes of data.train held out for validation "
          "episodes: a list of class ids, or a fraction in (0, 1) drawn "
          "from data.seed; disjoint from the training classes"),
      int_key(
          "validation.every_epochs",
          [](TrainConfig& c) { return &c.validation.every_epochs; },
          1,
          1e9,
          "validate after every n-th epoch and after the last"),
      int3_key(
          "validation.roi",
          [](TrainConfig& c) { return &c.validation.roi; },
          0,
          1 << 16,
          "volumes: sliding-window size [D, H, W] (0: data.patch_size)"),
      float_key(
          "validation.overlap",
          [](TrainConfig& c) { return &c.validation.overlap; },
          0,
          false,
          0.95,
          "volumes: overlap of neighbouring windows, a fraction of roi"),
      int_key(
          "validation.sw_batch",
          [](TrainConfig& c) { return &c.validation.sw_batch; },
          1,
          1 << 16,
          "volumes: windows per device batch (halved on out-of-memory)"),
      choice_key(
          "validation.blend",
          [](TrainConfig& c) { return &c.validation.blend; },
          "volumes: weight of a window's voxels when windows overlap "
          "(gaussian: MONAI's compute_importance_map)"),
      float_key(
          "validation.sigma_scale",
          [](TrainConfig& c) { return &c.validation.sigma_scale; },
          0,
          true,
          10,
          "volumes, blend gaussian: sigma of the window weights, a fraction "
          "of roi (MONAI's sigma_scale)"),
      choice_key(
          "validation.padding",
          [](TrainConfig& c) { return &c.validation.padding; },
          "volumes: where a case smaller than validation.roi (or, in "
          "training, data.patch_size) on an axis sits: symmetric (MONAI's "
          "sliding window and SpatialPad: half the padding before, the "
          "extra voxel after) or end (all padding after: validation's rule "
          "before 2026-11-27)"),
      bool_key(
          "validation.include_background",
          [](TrainConfig& c) { return &c.validation.include_background; },
          "Dice: class 0 counts in val_dice (MONAI DiceMetric's "
          "include_background)"),
      bool_key(
          "validation.ignore_empty",
          [](TrainConfig& c) { return &c.validation.ignore_empty; },
          "Dice: a class absent from a case's labels is left out of the "
          "means (MONAI DiceMetric's ignore_empty); false scores it 1 when "
          "the prediction lacks it too, else 0"),
      choice_key(
          "validation.offload",
          [](TrainConfig& c) { return &c.validation.offload; },
          "volumes: where the whole-volume probability sum and weight map "
          "live; cpu keeps the device peak independent of the volume size"),
      string_key(
          "validation.best_metric",
          [](TrainConfig& c) { return &c.validation.best_metric; },
          "output.dir/best.safetensors holds the weights of the epoch with "
          "the best value of this: auto (the task's first metric: val_dice "
          "for volumes and rows of volumes, val_mae for regression, "
          "val_accuracy otherwise), none (no best file), val_loss, or a "
          "metric the task reports (val_auc: binary classifiers; val_rmse: "
          "regression); the run names its metrics when it refuses one"),
      choice_key(
          "validation.best_mode",
          [](TrainConfig& c) { return &c.validation.best_mode; },
          "whether larger or smaller best_metric is better (auto: the "
          "metric's own direction: min for val_loss, val_mae and val_rmse, "
          "max otherwise)"),
      int_key(
          "validation.episodes",
          [](TrainConfig& c) { return &c.validation.episodes; },
          0,
          1 << 24,
          "few-shot: validation episodes from the validation classes, the "
          "same at every validation (mean accuracy and its 95% interval); "
          "0: none"),
      bool_key(
          "validation.dump_predictions",
          [](TrainConfig& c) { return &c.validation.dump_predictions; },
          "rows that belong to volumes (data.val with /volume_ids): write "
          "each volume's predicted classes to "
          "output.dir/val/epoch-EEE/volume-<id>.h5"),
      int_key(
          "training.epochs",
          [](TrainConfig& c) { return &c.training.epochs; },
          1,
          1e9,
          "passes over the training set"),
      int_key(
          "training.max_windows",
          [](TrainConfig& c) { return &c.training.max_windows; },
          0,
          9e15,
          "stop after this many accumulation windows in all (0 = no "
          "limit)"),
      int_key(
          "training.gradient_accumulation_steps",
          [](TrainConfig& c) {
            return &c.training.gradient_accumulation_steps;
          },
          1,
          1 << 16,
          "micro-steps per window; gradients are all-reduced once per "
          "window"),
      float_key(
          "training.lr",
          [](TrainConfig& c) { return &c.training.lr; },
          0,
          true,
          1e3,
          "learning rate (the peak, after warmup)"),
      choice_key(
          "training.lr_schedule",
          [](TrainConfig& c) { return &c.training.lr_schedule; },
          "after warmup: constant lr, cosine decay or poly decay "
          "(1 - t)^poly_power to min_lr at the last window of "
          "training.epochs"),
      int_key(
          "training.warmup_windows",
          [](TrainConfig& c) { return &c.training.warmup_windows; },
          0,
          1e12,
          "windows of linear warmup: window s (from 0) uses lr x (s + 1) / "
          "warmup_windows"),
      float_key(
          "training.min_lr",
          [](TrainConfig& c) { return &c.training.min_lr; },
          0,
          false,
          1e3,
          "cosine, poly: the learning rate the decay ends at"),
      float_key(
          "training.poly_power",
          [](TrainConfig& c) { return &c.training.poly_power; },
          0,
          true,
          100,
          "poly: the exponent of (1 - t)"),
      choice_key(
          "training.optimizer",
          [](TrainConfig& c) { return &c.training.optimizer; },
          "optimizer"),
      float_key(
          "training.momentum",
          [](TrainConfig& c) { return &c.training.momentum; },
          0,
          false,
          0.999999,
          "SGD momentum (sgd only)"),
      float_key(
          "training.weight_decay",
          [](TrainConfig& c) { return &c.training.weight_decay; },
          0,
          false,
          10,
          "weight decay (decoupled for adamw)"),
      float_key(
          "training.grad_clip_norm",
          [](TrainConfig& c) { return &c.training.grad_clip_norm; },
          0,
          false,
          kInf,
          "clip the global gradient norm to this (0 = off)"),
      [] {
        Key k = float_key(
            "training.label_smoothing",
            [](TrainConfig& c) { return &c.training.label_smoothing; },
            0,
            false,
            1,
            "classifiers of rows: cross-entropy's label smoothing s "
            "(LibTorch's), or for model.num_classes=1 the binary target "
            "y (1 - s) + s / 2 (timm's); validation's val_loss uses the "
            "same smoothed loss");
        k.max_exclusive = true;
        return k;
      }(),
      int_key(
          "training.effective_batch_size",
          [](TrainConfig& c) { return &c.training.effective_batch_size; },
          0,
          1 << 30,
          "samples per optimizer step over all ranks (0: ranks x "
          "gradient_accumulation_steps x data.batch_size); when set, the "
          "accumulation steps follow from it"),
      int_key(
          "training.checkpoint_every",
          [](TrainConfig& c) { return &c.training.checkpoint_every; },
          0,
          1e12,
          "write a checkpoint every this many windows (0: only at epoch "
          "ends and when training stops)"),
      int_key(
          "training.keep_checkpoints",
          [](TrainConfig& c) { return &c.training.keep_checkpoints; },
          1,
          1e6,
          "newest checkpoints kept in output.dir/checkpoints"),
      choice_key(
          "training.nonfinite",
          [](TrainConfig& c) { return &c.training.nonfinite; },
          "a NaN/Inf loss or gradient (any rank): skip the window's update, "
          "or stop with the last checkpoint as the resume point (fp16 runs "
          "use the loss scaler's skip); a NaN/Inf in a sample read is named "
          "(file, dataset, row) the first time, and stops the run at once "
          "with stop"),
      int_key(
          "training.max_nonfinite_skips",
          [](TrainConfig& c) { return &c.training.max_nonfinite_skips; },
          0,
          1e9,
          "skip: stop after this many non-finite windows in a row"),
      choice_key(
          "training.gradient_checkpointing",
          [](TrainConfig& c) { return &c.training.gradient_checkpointing; },
          "activation checkpointing of the model's segments; auto: the "
          "fewest segments that reach the micro-batch memory.budget allows; "
          "selective: every segment, keeping its convolutions' outputs and "
          "recomputing only the rest in backward (less memory than off, "
          "less time than all)"),
      choice_key(
          "training.contrastive_accumulation",
          [](TrainConfig& c) { return &c.training.contrastive_accumulation; },
          "dual_encoder: exact: the window's loss and update are those of "
          "one batch of the whole effective batch (embeddings gathered over "
          "micro-steps and ranks, then each micro-batch re-run with its "
          "graph); local: each micro-batch is its own contrastive batch "
          "(what plain accumulation gives; for comparison)"),
      choice_key(
          "training.amp",
          [](TrainConfig& c) { return &c.training.amp; },
          "mixed precision: bf16 autocast, or fp16 autocast with dynamic "
          "loss scaling (fp16 needs a CUDA build)"),
      float_key(
          "training.amp_init_scale",
          [](TrainConfig& c) { return &c.training.amp_init_scale; },
          1,
          false,
          1e30,
          "fp16: initial loss scale"),
      int_key(
          "training.amp_growth_interval",
          [](TrainConfig& c) { return &c.training.amp_growth_interval; },
          1,
          1e9,
          "fp16: finite steps in a row before the loss scale doubles"),
      int_key(
          "training.seed",
          [](TrainConfig& c) { return &c.training.seed; },
          0,
          int64_t{1} << 62,
          "random draws in training (dropout): each rank draws from its own "
          "stream derived from (seed, rank)"),
      bool_key(
          "training.deterministic",
          [](TrainConfig& c) { return &c.training.deterministic; },
          "deterministic algorithms where LibTorch has them, cuDNN without "
          "benchmarking, no TF32 in cuBLAS/cuDNN: reproducible, and CPU and "
          "GPU runs comparable within rounding; slower on a GPU"),
      choice_key(
          "training.cudnn_benchmark",
          [](TrainConfig& c) { return &c.training.cudnn_benchmark; },
          "cuDNN autotuning: each convolution shape times cuDNN's "
          "algorithms once and keeps the fastest (auto: on unless "
          "training.deterministic; GPUs only)"),
      budget_key(
          "memory.budget",
          [](TrainConfig& c) { return &c.memory.budget; },
          "device memory per rank: a profile (v100-16gb, v100-32gb, "
          "a100-40gb, a100-80gb), a size (512MiB, 14GiB) or none"),
      float_key(
          "memory.headroom",
          [](TrainConfig& c) { return &c.memory.headroom; },
          0,
          false,
          0.9,
          "fraction of the budget the planner keeps free"),
      int_key(
          "memory.max_oom_retries",
          [](TrainConfig& c) { return &c.memory.max_oom_retries; },
          0,
          64,
          "out-of-memory recoveries (micro-batch halvings) per window "
          "before the run stops"),
      choice_key(
          "memory.release_cache",
          [](TrainConfig& c) { return &c.memory.release_cache; },
          "auto: release cached device blocks before validation and when "
          "cached bytes pass memory.release_threshold x budget"),
      float_key(
          "memory.release_threshold",
          [](TrainConfig& c) { return &c.memory.release_threshold; },
          0,
          true,
          1,
          "cached (reserved - allocated) fraction of the budget that "
          "triggers a release"),
      float_key(
          "memory.leak_warn_mib",
          [](TrainConfig& c) { return &c.memory.leak_warn_mib; },
          0,
          true,
          1e9,
          "device bytes held at epoch end growing by more than this (MiB) "
          "..."),
      int_key(
          "memory.leak_epochs",
          [](TrainConfig& c) { return &c.memory.leak_epochs; },
          1,
          1e6,
          "... for this many epochs in a row is reported as a leak"),
      int_key(
          "memory.test_leak_kib_per_window",
          [](TrainConfig& c) { return &c.memory.test_leak_kib_per_window; },
          0,
          1 << 20,
          "for tests only: keep this many KiB of device memory alive per "
          "window, to check the leak warning"),
      int_key(
          "memory.test_oom_rank",
          [](TrainConfig& c) { return &c.memory.test_oom_rank; },
          -1,
          1e6,
          "for tests only: this rank runs out of device memory once, in the "
          "first micro-step of the run's first window (-1: none)"),
      choice_key(
          "memory.test_oom_in",
          [](TrainConfig& c) { return &c.memory.test_oom_in; },
          "for tests only: where memory.test_oom_rank runs out -- the first "
          "micro-step, or the last micro-step's backward once a gradient "
          "bucket's all-reduce is in flight"),
      string_key(
          "memory.host_budget",
          [](TrainConfig& c) { return &c.memory.host_budget; },
          "host memory per rank for offloaded activations "
          "(training.gradient_checkpointing offload, or auto's last tier): "
          "a size (16GiB) or auto, a quarter of the node's memory (its "
          "cgroup limit under SLURM) over the ranks on it; on a GPU it is "
          "page-locked by CUDA (a lower ulimit -l is reported, not "
          "applied)"),
      optional_string_key(
          "memory.allocator_conf",
          [](TrainConfig& c) { return &c.memory.allocator_conf; },
          "CUDA caching allocator settings, as PYTORCH_CUDA_ALLOC_CONF "
          "(applied before the first CUDA allocation; \"\" keeps "
          "LibTorch's defaults)"),
      choice_key(
          "dist.device",
          [](TrainConfig& c) { return &c.dist.device; },
          "where each rank trains: cuda (GPU <local rank>), cpu, or auto "
          "(cuda when this build and machine have a GPU, else cpu)"),
      choice_key(
          "dist.backend",
          [](TrainConfig& c) { return &c.dist.backend; },
          "collectives: nccl (CUDA tensors, CUDA builds), mpi (host "
          "tensors), or auto (nccl on a CUDA device, else mpi)"),
      float_key(
          "dist.timeout_s",
          [](TrainConfig& c) { return &c.dist.timeout_s; },
          0,
          false,
          1e7,
          "seconds a collective may take before the job is ended, naming "
          "the ranks that did not arrive (0: wait forever)"),
      float_key(
          "dist.bucket_mib",
          [](TrainConfig& c) { return &c.dist.bucket_mib; },
          1.0 / 1024,
          false,
          4096,
          "gradient all-reduce bucket size in MiB"),
      bool_key(
          "dist.overlap",
          [](TrainConfig& c) { return &c.dist.overlap; },
          "start each gradient bucket's all-reduce during the last "
          "micro-step's backward, as soon as its gradients are final"),
      choice_key(
          "dist.check_replicas",
          [](TrainConfig& c) { return &c.dist.check_replicas; },
          "verify that every rank holds bit-identical parameters"),
      string_key(
          "output.dir",
          [](TrainConfig& c) { return &c.output.dir; },
          "where metrics.jsonl and model.safetensors go"),
      choice_key(
          "output.progress",
          [](TrainConfig& c) { return &c.output.progress; },
          "progress display: tty redraws one line, lines prints a "
          "line every progress_every_s; auto picks tty only on a "
          "terminal outside mpirun/srun"),
      float_key(
          "output.progress_every_s",
          [](TrainConfig& c) { return &c.output.progress_every_s; },
          0,
          false,
          kInf,
          "seconds between progress lines when stdout is not a "
          "terminal"),
      bool_key(
          "output.save_initial",
          [](TrainConfig& c) { return &c.output.save_initial; },
          "write output.dir/initial.safetensors: the parameters the first "
          "window starts from (after a resume, the checkpoint's), named as "
          "in model.safetensors"),
      bool_key(
          "output.overwrite",
          [](TrainConfig& c) { return &c.output.overwrite; },
          "a fresh run into an output.dir holding another run's checkpoints "
          "or metrics: false refuses (continue it with --resume auto), true "
          "deletes that run's checkpoints, metrics, event files and weights "
          "first"),
  };
  return table;
}

const char* type_name(const Key& k) {
  switch (k.type) {
    case Key::Type::kInt:
      return "an integer";
    case Key::Type::kFloat:
      return "a number";
    case Key::Type::kBool:
      return "true or false";
    case Key::Type::kString:
      return "a string";
    case Key::Type::kChoice:
      return "one of";
    case Key::Type::kInt3:
      return "an integer or a list [D, H, W] of integers";
    case Key::Type::kClasses:
      return "a list [c1, c2, ...] of class ids or a fraction in (0, 1)";
    case Key::Type::kStrings:
      return "a list [a, b, ...] of strings";
    case Key::Type::kFloat2:
      return "a list [lo, hi] of two numbers, lo <= hi,";
    case Key::Type::kBudget:
      return "a string";
  }
  return "";
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    out += (i ? sep : "") + items[i];
  }
  return out;
}

std::string allowed(const Key& k) {
  std::ostringstream out;
  out << (k.allow_auto ? "auto or an integer" : type_name(k));
  if (k.type == Key::Type::kChoice) {
    out << " " << join(k.choices, ", ");
  } else if (
      k.type == Key::Type::kInt || k.type == Key::Type::kFloat ||
      k.type == Key::Type::kInt3 || k.type == Key::Type::kFloat2) {
    const bool has_min = std::isfinite(k.min);
    const bool has_max = std::isfinite(k.max);
    auto num = [&](double v) {
      std::ostringstream n;
      if (k.type != Key::Type::kFloat && k.type != Key::Type::kFloat2) {
        n << static_cast<int64_t>(v);
      } else {
        n << v;
      }
      return n.str();
    };
    if (has_min && has_max) {
      out << " in " << (k.min_exclusive ? "(" : "[") << num(k.min) << ", "
          << num(k.max) << (k.max_exclusive ? ")" : "]");
    } else if (has_min) {
      out << (k.min_exclusive ? " > " : " >= ") << num(k.min);
    }
  }
  return out.str();
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j)
    row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min(
          {row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

const Key& find_key(const std::string& name, const std::string& origin) {
  for (const auto& k : keys()) {
    if (k.name == name)
      return k;
  }
  std::string best;
  size_t best_d = 4;
  for (const auto& k : keys()) {
    const size_t d = edit_distance(name, k.name);
    if (d < best_d) {
      best_d = d;
      best = k.name;
    }
  }
  const std::string section = name.substr(0, name.find('.'));
  std::vector<std::string> same_section;
  for (const auto& k : keys()) {
    if (k.name.compare(0, section.size() + 1, section + ".") == 0) {
      same_section.push_back(k.name);
    }
  }
  std::ostringstream msg;
  msg << "config: unknown key '" << name << "'" << origin;
  if (!best.empty())
    msg << "; did you mean '" << best << "'?";
  if (!same_section.empty()) {
    msg << " Keys in '" << section << "': " << join(same_section, ", ");
  } else {
    std::vector<std::string> sections;
    for (const auto& k : keys()) {
      const std::string s = k.name.substr(0, k.name.find('.'));
      if (std::find(sections.begin(), sections.end(), s) == sections.end()) {
        sections.push_back(s);
      }
    }
    msg << " Sections: " << join(sections, ", ");
  }
  msg << " (`memtrain train --help` lists every key)";
  throw Error(msg.str());
}

std::string scalar_text(const YAML::Node& node) {
  if (node.IsScalar())
    return node.Scalar();
  if (node.IsNull())
    return "";  // `key:` with nothing after it
  YAML::Emitter out;
  out << YAML::Flow << node;
  return out.c_str();
}

void assign(
    TrainConfig& cfg,
    const Key& k,
    const YAML::Node& node,
    const std::string& origin) {
  const std::string text = scalar_text(node);
  auto fail = [&](const std::string& why) {
    throw Error(
        "config: " + k.name + " = '" + text + "'" + origin + ": " + why +
        "; allowed: " + allowed(k));
  };
  if (k.type == Key::Type::kInt3) {
    std::array<int64_t, 3> v{};
    const bool seq = node.IsSequence();
    if (!(node.IsScalar() || (seq && node.size() == 3)))
      fail("expected one integer or a list of three");
    for (size_t i = 0; i < 3; ++i) {
      try {
        v[i] = (seq ? node[i] : node).as<int64_t>();
      } catch (const YAML::Exception&) {
        fail("not an integer");
      }
      if (v[i] < k.min || v[i] > k.max)
        fail("out of range");
    }
    *k.t(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kFloat2) {
    std::array<double, 2> v{};
    if (!(node.IsSequence() && node.size() == 2))
      fail("expected a list of two numbers");
    for (size_t i = 0; i < 2; ++i) {
      try {
        v[i] = node[i].as<double>();
      } catch (const YAML::Exception&) {
        fail("not a number");
      }
      if (!std::isfinite(v[i]) || v[i] < k.min ||
          (k.min_exclusive && v[i] == k.min) || v[i] > k.max)
        fail("out of range");
    }
    if (v[0] > v[1])
      fail("lo is above hi");
    *k.r(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kClasses) {
    ClassChoice v;
    v.fraction = 0;
    try {
      if (node.IsSequence()) {
        for (const auto& item : node)
          v.ids.push_back(item.as<int64_t>());
      } else {
        v.fraction = node.as<double>();
      }
    } catch (const YAML::Exception&) {
      fail("not a list of integers or a number");
    }
    for (int64_t id : v.ids) {
      if (id < 0)
        fail("class ids are never negative");
    }
    if (node.IsSequence() && v.ids.empty())
      fail("an empty list");
    if (!node.IsSequence() && !(v.fraction > 0 && v.fraction < 1))
      fail("out of range");
    *k.c(cfg) = v;
    return;
  }
  if (k.type == Key::Type::kStrings) {
    std::vector<std::string> v;
    if (node.IsSequence()) {
      for (const auto& item : node) {
        if (!item.IsScalar() || item.Scalar().empty())
          fail("expected a list of non-empty strings");
        v.push_back(item.Scalar());
      }
    } else if (node.IsScalar() && !node.Scalar().empty()) {
      v.push_back(node.Scalar());
    } else if (!node.IsNull() && !node.IsScalar()) {
      fail("expected a list of strings");
    }
    *k.l(cfg) = v;
    return;
  }
  const bool string_like =
      k.type == Key::Type::kString || k.type == Key::Type::kBudget;
  if (node.IsNull() && string_like && !k.allow_empty)
    fail("empty; this key needs a value");  // `budget:` with nothing after
  if (!node.IsScalar())
    fail("expected a single value");
  switch (k.type) {
    case Key::Type::kInt: {
      int64_t v = 0;
      if (k.allow_auto && node.Scalar() == "auto") {
        *k.i(cfg) = kAuto;
        break;
      }
      try {
        v = node.as<int64_t>();
      } catch (const YAML::Exception&) {
        fail("not an integer");
      }
      if (v < k.min || v > k.max)
        fail("out of range");
      *k.i(cfg) = v;
      break;
    }
    case Key::Type::kFloat: {
      double v = 0;
      try {
        v = node.as<double>();
      } catch (const YAML::Exception&) {
        fail("not a number");
      }
      if (!std::isfinite(v) || v < k.min || (k.min_exclusive && v == k.min) ||
          v > k.max || (k.max_exclusive && v == k.max)) {
        fail("out of range");
      }
      *k.f(cfg) = v;
      break;
    }
    case Key::Type::kBool: {
      bool v = false;
      try {
        v = node.as<bool>();
      } catch (const YAML::Exception&) {
        fail("not a boolean");
      }
      *k.b(cfg) = v;
      break;
    }
    case Key::Type::kString:
      if (node.Scalar().empty() && !k.allow_empty)
        fail("empty; this key needs a value");
      *k.s(cfg) = node.Scalar();
      break;
    case Key::Type::kChoice:
      if (!k.set_choice(cfg, node.Scalar()))
        fail("not a valid choice");
      break;
    case Key::Type::kBudget:
      if (node.Scalar().empty())
        fail("empty; this key needs a value");
      *k.m(cfg) = BudgetSpec(node.Scalar());  // throws with the profiles
      break;
    case Key::Type::kInt3:
    case Key::Type::kClasses:
    case Key::Type::kStrings:
    case Key::Type::kFloat2:
      break;  // handled above
  }
}

void apply_tree(
    TrainConfig& cfg,
    const YAML::Node& node,
    const std::string& prefix,
    const std::string& origin) {
  // yaml-cpp keeps every entry of a mapping and this loop would apply each,
  // so a key (or section) written twice would silently take its last value.
  std::map<std::string, int> seen;  // key -> its first line
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    const std::string name = prefix.empty() ? key : prefix + "." + key;
    const int line = item.first.Mark().line + 1;
    const auto first = seen.emplace(key, line);
    if (!first.second) {
      throw Error(
          "config: " + std::string(item.second.IsMap() ? "section '" : "'") +
          name + "' is written twice" + origin + ", on lines " +
          std::to_string(first.first->second) + " and " + std::to_string(line) +
          " (YAML would keep the last silently); " + "keep one");
    }
    if (item.second.IsMap()) {
      // Only sections are maps; a key that is a map is either unknown
      // (find_key throws) or misused (assign reports it).
      bool is_section = false;
      for (const auto& k : keys()) {
        if (k.name.compare(0, name.size() + 1, name + ".") == 0) {
          is_section = true;
        }
      }
      if (is_section) {
        apply_tree(cfg, item.second, name, origin);
        continue;
      }
      if (item.second.size() > 0) {
        // An unknown section: name its first key, so the message lists the
        // sections there are.
        find_key(
            name + "." + item.second.begin()->first.as<std::string>(), origin);
      }
    }
    if (prefix.empty() && !item.second.IsMap()) {
      throw Error(
          "config: top-level entry '" + name + "'" + origin +
          " must be a section (a mapping of keys)");
    }
    assign(cfg, find_key(name, origin), item.second, origin);
  }
}

// The shortest decimal text that reads back as `v` (4/3: 1.3333333333333333).
std::string shortest(double v) {
  for (int digits = 6; digits <= 17; ++digits) {
    std::ostringstream out;
    out.precision(digits);
    out << v;
    if (std::strtod(out.str().c_str(), nullptr) == v)
      return out.str();
  }
  return std::to_string(v);
}

std::string value_text(const Key& k, TrainConfig& cfg) {
  std::ostringstream out;
  switch (k.type) {
    case Key::Type::kInt:
      if (k.allow_auto && *k.i(cfg) == kAuto) {
        out << "auto";
      } else {
        out << *k.i(cfg);
      }
      break;
    case Key::Type::kFloat:
      out << *k.f(cfg);
      break;
    case Key::Type::kBool:
      out << (*k.b(cfg) ? "true" : "false");
      break;
    case Key::Type::kInt3: {
      const auto& v = *k.t(cfg);
      out << "[" << v[0] << ", " << v[1] << ", " << v[2] << "]";
      break;
    }
    case Key::Type::kClasses: {
      const ClassChoice& v = *k.c(cfg);
      if (v.ids.empty()) {
        out << v.fraction;
        break;
      }
      out << "[";
      for (size_t i = 0; i < v.ids.size(); ++i)
        out << (i ? ", " : "") << v.ids[i];
      out << "]";
      break;
    }
    case Key::Type::kStrings: {
      YAML::Emitter e;
      e << YAML::Flow << *k.l(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kFloat2: {
      const auto& v = *k.r(cfg);
      out << "[" << shortest(v[0]) << ", " << shortest(v[1]) << "]";
      break;
    }
    case Key::Type::kString: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << *k.s(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kChoice: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << k.get_choice(cfg);
      out << e.c_str();
      break;
    }
    case Key::Type::kBudget: {
      YAML::Emitter e;
      e << YAML::DoubleQuoted << k.m(cfg)->text();
      out << e.c_str();
      break;
    }
  }
  return out.str();
}

std::string emit(const TrainConfig& cfg_in, bool with_help) {
  TrainConfig cfg = cfg_in;
  std::ostringstream out;
  std::string section, sub;
  for (const auto& k : keys()) {
    const std::string s = k.name.substr(0, k.name.find('.'));
    if (s != section) {
      section = s;
      sub.clear();
      out << s << ":\n";
    }
    // A third level (data.episodes.n_way): its keys sit together in the
    // table, under one "  episodes:" line.
    std::string rest = k.name.substr(s.size() + 1);
    const size_t dot = rest.find('.');
    const std::string ks = dot == std::string::npos ? "" : rest.substr(0, dot);
    if (ks != sub && !ks.empty())
      out << "  " << ks << ":\n";
    sub = ks;
    if (!ks.empty())
      rest = "  " + rest.substr(dot + 1);
    out << "  " << rest << ": " << value_text(k, cfg);
    if (with_help)
      out << "  # " << k.help;
    out << "\n";
  }
  return out.str();
}

}  // namespace

std::string TrainConfig::default_yaml() {
  return emit(TrainConfig{}, /*with_help=*/true);
}

std::string TrainConfig::to_yaml() const {
  return emit(*this, /*with_help=*/false);
}

std::string TrainConfig::describe_keys() {
  std::ostringstream out;
  TrainConfig defaults;
  for (const auto& k : keys()) {
    out << "  --" << k.name << "=VALUE\n      " << k.help << "\n      "
        << allowed(k) << "; default " << value_text(k, defaults) << "\n";
  }
  return out.str();
}

void TrainConfig::set(const std::string& assignment) {
  const auto eq = assignment.find('=');
  MT_CHECK(
      eq != std::string::npos && eq > 0,
      "config: override '",
      assignment,
      "' is not of the form section.key=value (e.g. --training.lr=0.1)");
  const std::string name = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  const Key& k = find_key(name, " (command line)");
  YAML::Node node;
  try {
    node = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw Error(
        "config: " + name + " = '" + text +
        "' (command line): not valid YAML: " + e.msg);
  }
  if (node.IsNull())
    node = YAML::Node(text);  // "--data.val=" means ""
  if ((k.type == Key::Type::kString || k.type == Key::Type::kBudget) &&
      node.IsScalar()) {
    node = YAML::Node(text);  // keep strings verbatim (no YAML typing)
  }
  assign(*this, k, node, " (command line)");
}

TrainConfig TrainConfig::load(
    const std::string& yaml_path, const std::vector<std::string>& overrides) {
  TrainConfig cfg;
  if (!yaml_path.empty()) {
    // stat first: opening a FIFO (or a device) would wait for a writer.
    struct stat st {};
    if (::stat(yaml_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
      throw Error(
          "config: '" + yaml_path + "' is " + file_kind(st.st_mode) +
          ", not a regular file; --config reads a YAML file (every rank "
          "reads it): write the configuration to a file");
    }
    std::ifstream in(yaml_path);
    MT_CHECK(
        in.good(),
        "config: cannot read '",
        yaml_path,
        "': no such file or not readable (pass an existing YAML file to "
        "--config, or leave --config out for the built-in defaults)");
    const std::string origin = " (in " + yaml_path + ")";
    YAML::Node root;
    try {
      root = YAML::LoadFile(yaml_path);
    } catch (const YAML::Exception& e) {
      throw Error(
          "config: '" + yaml_path + "' is not valid YAML: line " +
          std::to_string(e.mark.line + 1) + ": " + e.msg);
    }
    if (!root.IsNull()) {
      MT_CHECK(
          root.IsMap(),
          "config: '",
          yaml_path,
          "' must be a YAML mapping of sections (model:, data:, ...)");
      apply_tree(cfg, root, "", origin);
    }
  }
  for (const auto& o : overrides)
    cfg.set(o);
  cfg.validate();
  return cfg;
}

void TrainConfig::validate() const {
  MT_CHECK(
      training.min_lr <= training.lr,
      "config: training.min_lr = ",
      training.min_lr,
      " is above training.lr = ",
      training.lr,
      "; the decay ends at min_lr, so set it below lr");
  MT_CHECK(
      !data.train.empty(),
      "config: data.train is empty; set it to a training HDF5 file "
      "(memtrain make-data makes one)");
  MT_CHECK(!output.dir.empty(), "config: output.dir is empty; set a folder");
  MT_CHECK(
      model.pretrained_rename.empty() || !model.pretrained.empty(),
      "config: model.pretrained_rename is set but model.pretrained is not; "
      "set the weights file or drop the rules");
  MT_CHECK(
      std::none_of(
          output.dir.begin(),
          output.dir.end(),
          [](char c) { return static_cast<unsigned char>(c) < 0x20; }),
      "config: output.dir = '",
      output.dir,
      "' holds a control character (a newline or tab?): the run's files and "
      "plots name it in logs and scripts; choose a folder name without one");
  MT_CHECK(
      data.batch_size != kAuto || training.effective_batch_size > 0,
      "config: data.batch_size=auto needs training.effective_batch_size "
      "(the samples per optimizer step the planner must reach)");
  if (memory.host_budget != "auto") {
    try {
      (void)parse_memory_size(memory.host_budget);
    } catch (const Error& e) {
      throw Error(detail::concat(
          "config: memory.host_budget = '",
          memory.host_budget,
          "': ",
          e.what(),
          "; or auto (a quarter of the node's memory over its ranks)"));
    }
  }
  MT_CHECK(
      data.batch_size != kAuto || memory.budget.limited(),
      "config: data.batch_size=auto needs memory.budget (what the "
      "micro-batch must fit in), e.g. --memory.budget=v100-16gb");
  MT_CHECK(
      training.effective_batch_size == 0 ||
          training.gradient_accumulation_steps == 1,
      "config: set training.effective_batch_size or "
      "training.gradient_accumulation_steps, not both (the steps follow "
      "from the effective batch)");
  MT_CHECK(
      MEMTRAIN_CUDA || training.amp != Amp::kFp16,
      "config: training.amp=fp16 needs a CUDA build (fp16 autocast runs "
      "on CUDA devices); on this CPU build use training.amp=bf16");
  const bool episodic = data.episodes.n_way > 0;
  MT_CHECK(
      episodic == (model.head != Head::kLinear),
      "config: data.episodes.n_way=",
      data.episodes.n_way,
      " with model.head=",
      model.head,
      ": episodes need a few-shot head and a few-shot head needs episodes; "
      "set model.head=prototype, cosine or cosine_transformer with "
      "data.episodes.n_way >= 2, or "
      "model.head=linear with data.episodes.n_way=0");
  // The rules that depend on the model are its registry's
  // (model/registry.h: check_model_config).
  MT_CHECK(
      training.cudnn_benchmark != Switch::kOn || !training.deterministic,
      "config: training.cudnn_benchmark=on picks cuDNN's algorithms by "
      "timing them, which training.deterministic=true rules out; set "
      "training.cudnn_benchmark=auto (off when deterministic) or "
      "training.deterministic=false");
  MT_CHECK(
      !model.sync_bn || !episodic,
      "config: model.sync_bn: true is for row windows; few-shot episodes "
      "(data.episodes.n_way > 0) train with each micro-batch's own "
      "batch-norm statistics: set model.sync_bn=false");
  MT_CHECK(
      !episodic || data.episodes.n_way >= 2,
      "config: data.episodes.n_way=1: an episode needs at least 2 classes");
  // Which metrics a run reports is the task's to say (Note [Tasks]); the
  // run checks the key against them when it starts. Here: the shape.
  const std::string& best = validation.best_metric;
  MT_CHECK(
      best == "auto" || best == "none" ||
          (best.rfind("val_", 0) == 0 && best.size() > 4 &&
           std::all_of(
               best.begin(),
               best.end(),
               [](char c) {
                 return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                        c == '_';
               })),
      "config: validation.best_metric = '",
      best,
      "' is not a metric's key: give auto, none, val_loss or a metric of the "
      "run's task (val_dice, val_accuracy, val_auc, val_mae, ...)");
  MT_CHECK(
      training.optimizer == Optimizer::kSgd || training.momentum == 0.0 ||
          training.momentum == TrainingConfig{}.momentum,
      "config: training.momentum = ",
      training.momentum,
      " applies to training.optimizer=sgd only, but the optimizer is '",
      training.optimizer,
      "'; remove training.momentum");
}

int64_t TrainConfig::effective_batch(int world) const {
  return training.effective_batch_size > 0
             ? training.effective_batch_size
             : world * training.gradient_accumulation_steps * data.batch_size;
}

}  // namespace memtrain
