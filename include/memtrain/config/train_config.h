#pragma once
// TrainConfig: every setting of a training run, read from YAML and
// `--section.key=value` overrides, validated before any rank touches data.
// Errors name the key, the value and what is allowed (memtrain::Error).
// Every key is one row of config/keys.def: its field, type, default, check
// and help.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "memtrain/config/choices.h"
#include "memtrain/config/memory_size.h"

namespace memtrain {

// A list of three integers [D, H, W], a range [lo, hi], a list of strings:
// the types of keys that are lists.
using Int3 = std::array<int64_t, 3>;
using Range2 = std::array<double, 2>;
using Strings = std::vector<std::string>;

constexpr int64_t kAuto = 0;  // "auto" for integer keys that allow it
// data.prefetch's auto, where 0 is a depth: the deepest the host budget
// fits, up to 2 (Note [Host plan]).
constexpr int64_t kPrefetchAuto = -1;

// data.val_classes: the classes held out for validation episodes, as a
// list of class ids, or (ids empty) a fraction of the classes drawn from
// data.seed.
struct ClassChoice {
  std::vector<int64_t> ids;
  double fraction = 0.2;
};

// Each section's fields and defaults are its rows of config/keys.def.
#define MEMTRAIN_FIELD(field, type, def, check, help) type field = def;

// model.fsct: the few-shot cosine transformer head (model.head:
// cosine_transformer; Note [The few-shot cosine transformer]). Defaults:
// the paper's (Nguyen et al., IEEE Access 2023).
struct FsctConfig {
#define FSCT_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

// model.context: dinov3's second extraction, on a larger crop around each
// patch (input/context_crop.h); scale 0: none.
struct ContextConfig {
#define CONTEXT_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct ModelConfig {
#define MODEL_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
  FsctConfig fsct;        // model.fsct.*
  ContextConfig context;  // model.context.*
};

// data.episodes: N-way K-shot episodes with Q queries per class; n_way 0
// trains on rows (no episodes).
struct EpisodeConfig {
#define EPISODES_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct DataConfig {
#define DATA_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
  EpisodeConfig episodes;  // data.episodes.*
};

struct ValidationConfig {
#define VALIDATION_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct TrainingConfig {
#define TRAINING_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct MemoryConfig {
#define MEMORY_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct DistConfig {
#define DIST_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

struct OutputConfig {
#define OUTPUT_KEY MEMTRAIN_FIELD
#include "memtrain/config/keys.def"
};

#undef MEMTRAIN_FIELD

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

  // docs/config.md: every key by section, with its default, what is
  // allowed and its help (`memtrain train --keys-markdown`).
  static std::string describe_markdown();

  // E, the samples of one optimizer step over `world` ranks:
  // training.effective_batch_size, else world x
  // training.gradient_accumulation_steps x data.batch_size.
  int64_t effective_batch(int world) const;
};

}  // namespace memtrain
