#pragma once
// model.name=cnn: the small CNN for /images rows. stem = relu(conv3x3),
// model.depth stages conv3x3 -> [group norm] -> relu -> 2x2 max-pool (while
// the image allows), channels doubling, each a checkpoint segment
// ("stages.<i>"), head = global average pool -> Linear.

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

std::shared_ptr<Classifier> make_small_cnn(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
