#pragma once
// TrainConfig: every setting of a training run, read from YAML and
// `--section.key=value` overrides, validated before any rank touches data.
// Errors name the key, the value and what is allowed (memtrain::Error).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"
#include "memtrain/config/memory_size.h"

namespace memtrain {

// model.fsct: the few-shot cosine transformer head (model.head:
// cosine_transformer; Note [The few-shot cosine transformer]). Defaults:
// the paper's (Nguyen et al., IEEE Access 2023).
struct FsctConfig {
  int64_t heads = 8;      // attention heads
  int64_t dim_head = 64;  // width of each head (and of the output layer)
  int64_t mlp_dim = 512;  // hidden width of the feed-forward block
  int64_t depth = 1;      // attention + feed-forward repetitions
};

struct ModelConfig {
  // mlp (for /features) | cnn, resnet50, seresnext50_32x4d (for /images) |
  // unet3d, swin_unetr (for /volumes) | dual_encoder, clip (for pair files)
  ModelName name = ModelName::kMlp;
  int64_t hidden = 64;  // width of the MLP's hidden layer / CNN channels
  // MLP residual blocks / CNN stages / U-Net levels (checkpoint segments)
  int64_t depth = 2;
  double dropout = 0.0;     // MLP blocks
  Norm norm = Norm::kNone;  // none | group | instance (unet3d)
  // unet3d: channels of the first level; swin_unetr: MONAI's feature_size
  // (a multiple of 12); kAuto: the model's own (model/registry.h:
  // model_feature_size).
  int64_t feature_size = 0;
  int64_t in_channels = 0;  // unet3d: 0 = the data's C
  int64_t num_classes = 0;  // 0 = the data's num_classes; 1 = binary
  int64_t seed = 1234;      // parameter initialisation
  // Few-shot: linear (a class per output) | prototype | cosine |
  // cosine_transformer: the backbone's outputs are an embed_dim-wide embedding,
  // scored against the episode's class prototypes
  // (src/model/blocks/fewshot_head.cpp).
  Head head = Head::kLinear;
  int64_t embed_dim = 64;
  double cosine_scale = 10.0;  // cosine: initial value of the learnable s
  FsctConfig fsct;             // cosine_transformer
  // dual_encoder, clip: the temperature the learnable logit scale starts
  // from.
  double init_temperature = 0.07;
  // clip: open_clip's model config (ViT-B-32, ViT-B-16, tiny; -quickgelu).
  std::string variant = "ViT-B-32";
  // A safetensors file whose tensors are loaded by name before training
  // ("": none; not on resume: the checkpoint wins); strict: any missing,
  // unexpected or shape-mismatched tensor is a start-up error.
  std::string pretrained;
  bool pretrained_strict = true;
  std::vector<std::string> pretrained_rename;  // "REGEX -> REPLACEMENT"
  // Name prefixes of parameters that do not train
  // (weights/model_state.h).
  std::vector<std::string> freeze;
  // Batch-norm statistics over every rank's concurrent micro-batch
  // (model/blocks/sync_batch_norm.h; the ResNets only).
  bool sync_bn = false;
  // Channels-last (NHWC) parameters and inputs for the 2D convolutional
  // models: auto = on a CUDA device (device_setup.h: channels_last_on).
  Switch channels_last = Switch::kAuto;
};

// data.val_classes: the classes held out for validation episodes, as a
// list of class ids, or (ids empty) a fraction of the classes drawn from
// data.seed.
struct ClassChoice {
  std::vector<int64_t> ids;
  double fraction = 0.2;
};

// data.episodes: N-way K-shot episodes with Q queries per class; n_way 0
// trains on rows (no episodes).
struct EpisodeConfig {
  int64_t n_way = 0;
  int64_t k_shot = 1;
  int64_t n_query = 15;
  int64_t per_epoch = 1000;  // training episodes per epoch
};

constexpr int64_t kAuto = 0;  // "auto" for integer keys that allow it

struct DataConfig {
  std::string train = "runs/data/train.h5";
  std::string val = "runs/data/val.h5";  // "" disables validation
  // A node-local folder: each node reads its own copies of train and val
  // from there ("": read them where they are; src/cli/stage_data.h).
  std::string stage_dir;
  int64_t batch_size = 16;     // micro-batch per rank
  int64_t val_batch_size = 0;  // 0: the training micro-batch
  int64_t seed = 0;            // epoch permutation seed
  bool drop_last = false;      // drop the epoch's last, partial window
  // Volumes (/volumes files): a training sample is a patch.
  std::array<int64_t, 3> patch_size{32, 32, 32};  // [D, H, W] voxels
  int64_t patches_per_volume = 8;  // training samples per volume per epoch
  double pos_fraction = 0.5;       // patches centred on a foreground voxel
  Flip flip = Flip::kNone;         // none | w | all: random mirroring
  double intensity_scale = 0.0;    // 0: the file's /volumes scale attribute
  double intensity_shift = 0.0;    // used when intensity_scale != 0
  int64_t prefetch = 2;      // micro-batches read ahead (0: read in place)
  int64_t read_threads = 2;  // background reader threads
  // Images (/images rows; input/image_augment.h): auto | none | flip |
  // crop_flip (auto: crop_flip for the ResNets, none otherwise), the
  // random resized crop's area and aspect ranges, and auto | none |
  // imagenet normalisation (auto: imagenet for the ResNets on 3 channels).
  Augment augment = Augment::kAuto;
  std::array<double, 2> crop_scale{0.08, 1.0};
  std::array<double, 2> crop_ratio{0.75, 4.0 / 3.0};
  Normalize normalize = Normalize::kAuto;
  EpisodeConfig episodes;
  ClassChoice val_classes;
};

struct ValidationConfig {
  int64_t every_epochs = 1;  // validate after every n-th epoch (and the last)
  std::array<int64_t, 3> roi{0, 0, 0};  // sliding window; 0: data.patch_size
  double overlap = 0.25;
  int64_t sw_batch = 4;            // windows per device batch
  Blend blend = Blend::kGaussian;  // gaussian | constant
  double sigma_scale = 0.125;      // gaussian: sigma = sigma_scale * roi
  // Where a case smaller than the window (or the training patch) sits in
  // it: symmetric (MONAI's: half the padding before, the rest after) or
  // end (the case at the start, all padding after).
  Padding padding = Padding::kSymmetric;
  // Dice (Note [One Dice]): whether class 0 counts in the means, and
  // whether a class absent from a case's labels is left out (NaN) or
  // scored (1 when the prediction lacks it too, else 0).
  bool include_background = false;
  bool ignore_empty = true;
  Offload offload = Offload::kCpu;  // cpu | device: where sums live
  // best.safetensors: the validation metric that ranks epochs, a key of
  // the task's metrics or val_loss (auto: the task's first metric with a
  // direction; none: no best file), checked against the run's task when it
  // starts, and its direction (auto: the metric's own).
  std::string best_metric = "auto";
  BestMode best_mode = BestMode::kAuto;  // auto | max | min
  int64_t episodes = 600;  // few-shot: validation episodes (fixed by seed)
  // Rows that belong to volumes: each rank writes its volumes' prediction
  // grids to output.dir/val/epoch-EEE/volume-<id>.h5 (docs/data-format.md).
  bool dump_predictions = false;
};

struct TrainingConfig {
  int64_t epochs = 3;
  int64_t max_windows = 0;  // stop after this many windows (0 = no limit)
  int64_t gradient_accumulation_steps = 1;
  double lr = 0.05;
  // The learning rate of window s (counted over the whole run, epochs x
  // windows per epoch): linear warmup over warmup_windows, then constant,
  // cosine or poly decay to min_lr (src/train/state/lr_schedule.cpp).
  LrSchedule lr_schedule = LrSchedule::kConstant;  // constant | cosine | poly
  int64_t warmup_windows = 0;
  double min_lr = 0.0;
  double poly_power = 0.9;
  Optimizer optimizer = Optimizer::kSgd;  // sgd | adamw
  double momentum = 0.9;                  // sgd only
  double weight_decay = 0.0;
  double grad_clip_norm = 0.0;  // 0 = no clipping
  // Classifiers of rows: cross-entropy's label smoothing, or for a binary
  // model (model.num_classes 1) the target y (1 - s) + s / 2.
  double label_smoothing = 0.0;
  int64_t effective_batch_size = 0;  // 0: ranks x accumulation x micro
  int64_t checkpoint_every = 0;      // windows between checkpoints (0: epochs)
  int64_t keep_checkpoints = 2;      // newest checkpoints kept
  Nonfinite nonfinite = Nonfinite::kSkip;  // skip | stop (non-fp16 runs)
  int64_t max_nonfinite_skips = 10;        // consecutive skips before stopping
  Checkpointing gradient_checkpointing =
      Checkpointing::kOff;  // off|all|auto|selective
  // dual_encoder: exact (one batch of the whole window) | local (each
  // micro-batch its own batch).
  ContrastiveAccumulation contrastive_accumulation =
      ContrastiveAccumulation::kExact;
  Amp amp = Amp::kOff;                 // off | fp16 | bf16
  double amp_init_scale = 65536.0;     // fp16 loss scale to start from
  int64_t amp_growth_interval = 2000;  // finite steps before the scale grows
  // Dropout and other random draws: each rank draws from its own stream
  // derived from (seed, rank).
  int64_t seed = 0;
  // Deterministic kernels where LibTorch has them, no TF32 (CUDA): the same
  // config gives the same weights on CPU and GPU within rounding. Slower.
  bool deterministic = false;
  // cuDNN autotuning (benchmark mode): auto = on unless deterministic
  // (device_setup.h: cudnn_benchmark_on).
  Switch cudnn_benchmark = Switch::kAuto;
};

struct MemoryConfig {
  BudgetSpec budget;            // profile, size, or none (parsed when set)
  double headroom = 0.1;        // fraction of the budget the planner keeps free
  int64_t max_oom_retries = 4;  // halvings of the micro-batch per window
  ReleaseCache release_cache = ReleaseCache::kAuto;  // auto | never
  double release_threshold = 0.25;  // auto: release when cached > this x cap
  double leak_warn_mib = 8.0;       // growth per epoch that counts as a leak
  int64_t leak_epochs = 3;          // ... for this many epochs in a row
  int64_t test_leak_kib_per_window = 0;  // tests only: leak this much
  int64_t test_oom_rank = -1;            // tests only: this rank runs out once
  // ... micro_step | boundary_backward
  TestOomIn test_oom_in = TestOomIn::kMicroStep;
  // Host memory for offloaded activations (Note [Host offload]): "auto"
  // or a size (memory/host_pool.h: host_budget_bytes).
  std::string host_budget = "auto";
  // CUDA caching allocator settings (PYTORCH_CUDA_ALLOC_CONF syntax),
  // applied before the first CUDA allocation.
  std::string allocator_conf = "expandable_segments:True";
};

struct DistConfig {
  // auto: cuda:<local rank> when LibTorch sees a GPU, else cpu.
  DeviceChoice device = DeviceChoice::kAuto;  // auto | cpu | cuda
  // auto: nccl for CUDA tensors on a CUDA build, mpi otherwise.
  BackendChoice backend = BackendChoice::kAuto;  // auto | mpi | nccl
  double timeout_s = 600.0;  // a collective taking longer ends the job
  double bucket_mib = 25.0;  // gradient bucket size
  // Start a bucket\'s all-reduce in the last micro-step\'s backward, as soon
  // as its gradients are final.
  bool overlap = true;
  CheckReplicas check_replicas = CheckReplicas::kEpoch;  // off|epoch|window
};

struct OutputConfig {
  std::string dir = "runs/default";
  // auto: redraw in place only on a terminal outside mpirun/srun (Open MPI
  // gives every rank a pty, so isatty() cannot tell a log file from a
  // terminal there); lines: a full line every progress_every_s seconds.
  ProgressDisplay progress = ProgressDisplay::kAuto;  // auto | tty | lines
  double progress_every_s = 5.0;
  // Rank 0 writes output.dir/initial.safetensors, the parameters the first
  // window starts from (after a resume: the checkpoint's), before it runs.
  bool save_initial = false;
  // A fresh run (no --resume) into an output.dir that holds another run's
  // checkpoints or metrics is refused unless this is true; then that run's
  // checkpoints, metrics, event files and weights are deleted first.
  bool overwrite = false;
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  ValidationConfig validation;
  TrainingConfig training;
  DistConfig dist;
  MemoryConfig memory;
  OutputConfig output;

  // The built-in defaults as YAML (what `memtrain train` uses without
  // --config); every key with its help text as a comment.
  static std::string default_yaml();

  // Loads defaults, then `yaml_path` (if not empty), then `overrides`
  // ("section.key=value"), then validates. Throws memtrain::Error naming the
  // key, the value and what is allowed.
  static TrainConfig load(
      const std::string& yaml_path, const std::vector<std::string>& overrides);

  // Applies one "section.key=value" override (value parsed as YAML).
  void set(const std::string& assignment);

  // Cross-field checks; throws memtrain::Error.
  void validate() const;

  // The resolved configuration as YAML.
  std::string to_yaml() const;

  // "key: help" lines for `memtrain train --help`.
  static std::string describe_keys();

  // E, the samples of one optimizer step over `world` ranks:
  // training.effective_batch_size, else world x
  // training.gradient_accumulation_steps x data.batch_size.
  int64_t effective_batch(int world) const;
};

}  // namespace memtrain
