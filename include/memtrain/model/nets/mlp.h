#pragma once
// model.name=mlp: the residual feature MLP for /features rows. stem =
// relu(input(x)) (with /context_features: relu(input(x) + context(c))),
// model.depth blocks x + fc2(dropout(relu([group norm](fc1(x))))) 4x wide
// inside, each a checkpoint segment ("blocks.<i>"), head = Linear.

#include <memory>

#include "memtrain/config/train_config.h"
#include "memtrain/model/models.h"

namespace memtrain {

std::shared_ptr<Classifier> make_mlp(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
