#pragma once
// TrainConfig: every setting of a training run, read from YAML and
// `--section.key=value` overrides, validated before any rank touches data.
// Errors name the key, the value and what is allowed (memtrain::Error).

#include <cstdint>
#include <string>
#include <vector>

namespace memtrain {

struct ModelConfig {
  std::string name = "mlp";  // mlp (for /features) | cnn (for /images)
  int64_t hidden = 64;       // width of the MLP's hidden layer / CNN channels
  int64_t depth = 2;  // MLP residual blocks / CNN stages (checkpoint segments)
  double dropout = 0.0;       // MLP blocks
  std::string norm = "none";  // none | group
  int64_t seed = 1234;        // parameter initialisation
};

constexpr int64_t kAuto = 0;  // "auto" for integer keys that allow it

struct DataConfig {
  std::string train = "runs/data/train.h5";
  std::string val = "runs/data/val.h5";  // "" disables validation
  int64_t batch_size = 16;               // micro-batch per rank
  int64_t val_batch_size = 0;            // 0: the training micro-batch
  int64_t seed = 0;                      // epoch permutation seed
  bool drop_last = false;  // drop the epoch's last, partial window
};

struct TrainingConfig {
  int64_t epochs = 3;
  int64_t max_windows = 0;  // stop after this many windows (0 = no limit)
  int64_t gradient_accumulation_steps = 1;
  double lr = 0.05;
  std::string optimizer = "sgd";  // sgd | adamw
  double momentum = 0.9;          // sgd only
  double weight_decay = 0.0;
  double grad_clip_norm = 0.0;       // 0 = no clipping
  int64_t effective_batch_size = 0;  // 0: ranks x accumulation x micro
  int64_t checkpoint_every = 0;      // windows between checkpoints (0: epochs)
  int64_t keep_checkpoints = 2;      // newest checkpoints kept
  std::string nonfinite = "skip";    // skip | stop (non-fp16 runs)
  int64_t max_nonfinite_skips = 10;  // consecutive skips before stopping
  std::string gradient_checkpointing = "off";  // off | all | auto
  std::string amp = "off";                     // off | fp16 | bf16
  double amp_init_scale = 65536.0;             // fp16 loss scale to start from
  int64_t amp_growth_interval = 2000;  // finite steps before the scale grows
};

struct MemoryConfig {
  std::string budget = "none";  // profile, size, or none
  double headroom = 0.1;        // fraction of the budget the planner keeps free
  int64_t max_oom_retries = 4;  // halvings of the micro-batch per window
  std::string release_cache = "auto";  // auto | never
  double release_threshold = 0.25;     // auto: release when cached > this x cap
  double leak_warn_mib = 8.0;          // growth per epoch that counts as a leak
  int64_t leak_epochs = 3;             // ... for this many epochs in a row
  int64_t test_leak_kib_per_window = 0;  // tests only: leak this much
};

struct DistConfig {
  double timeout_s = 600.0;  // a collective taking longer ends the job
  double bucket_mib = 25.0;  // gradient bucket size
  std::string check_replicas = "epoch";  // off | epoch | window
};

struct OutputConfig {
  std::string dir = "runs/default";
  // auto: redraw in place only on a terminal outside mpirun/srun (Open MPI
  // gives every rank a pty, so isatty() cannot tell a log file from a
  // terminal there); lines: a full line every progress_every_s seconds.
  std::string progress = "auto";  // auto | tty | lines
  double progress_every_s = 5.0;
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
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
};

}  // namespace memtrain
