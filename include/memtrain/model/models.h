#pragma once
// Models of this slice: a feature MLP (for /features files) and a small CNN
// (for /images). Neither has batch-norm: its statistics would make a window's
// update depend on how the window is split into micro-batches and ranks.
// Parameter names are the modules' own ("fc1.weight", ...) and are what
// model.safetensors stores.

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/data/h5_dataset.h"

namespace memtrain {

class Classifier : public torch::nn::Module {
 public:
  // x: (N, F) or (N, C, H, W) float32 -> logits (N, num_classes).
  virtual torch::Tensor forward(torch::Tensor x) = 0;
};

struct ModelInput {
  SampleKind kind = SampleKind::kFeatures;
  std::vector<int64_t> sample_shape;  // [F] or [C, H, W]
  int64_t num_classes = 0;
};

// Builds `cfg.name` for `input`, initialised from `cfg.seed` alone (the same
// parameters on every rank and at every world size). Throws memtrain::Error
// when the model does not fit the data kind.
std::shared_ptr<Classifier> make_model(
    const ModelConfig& cfg, const ModelInput& input);

}  // namespace memtrain
