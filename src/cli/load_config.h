#pragma once
// Private to src/cli/: the config every command runs with.

#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/model/registry.h"

namespace memtrain::cli {

// TrainConfig::load (defaults, `path`, `overrides`, the config's rules),
// then the rules of the model it names (model/registry.h:
// check_model_config). Throws memtrain::Error.
inline TrainConfig load_config(
    const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig cfg = TrainConfig::load(path, overrides);
  check_model_config(cfg);
  return cfg;
}

}  // namespace memtrain::cli
