// memtrain predict's model below the command line (infer/): what it checks
// in data.train, that it predicts with the loaded weights in eval mode,
// and that it needs none of a training run's keys.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/device/placement.h"
#include "memtrain/infer/inference_model.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/model/volume_model.h"
#include "memtrain/train/eval/validator.h"
#include "memtrain/weights/model_state.h"
#include "memtrain/weights/safetensors.h"
#include "test_support.h"

namespace memtrain {
namespace {

using test::error_of;

// A 2-class volumes file (1 channel, 16^3) and a small U-Net config on it.
TrainConfig volume_config(const test::TempDir& dir) {
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 2;
  spec.classes = 2;
  spec.channels = 1;
  spec.depth = spec.height = spec.width = 16;
  make_synthetic(spec, dir.file("v.h5"));
  TrainConfig cfg;
  cfg.data.train = dir.file("v.h5");
  cfg.model.name = ModelName::kUnet3d;
  cfg.model.depth = 2;
  cfg.model.feature_size = 4;
  cfg.data.patch_size = {8, 8, 8};
  cfg.validation.sw_batch = 2;
  return cfg;
}

TEST(InferenceModel, TrainedOnChecksTheConfigAgainstDataTrain) {
  test::TempDir dir("infer");
  TrainConfig cfg = volume_config(dir);
  const TrainedOn on = trained_on(cfg, "predict");
  EXPECT_EQ(on.num_classes, 2);
  EXPECT_EQ(on.data.sample_shape[0], 1);
  cfg.model.num_classes = 5;  // more outputs than the data's classes
  EXPECT_EQ(trained_on(cfg, "predict").num_classes, 5);

  TrainConfig mlp = volume_config(dir);
  mlp.model.name = ModelName::kMlp;
  EXPECT_NE(
      error_of([&] { trained_on(mlp, "predict"); })
          .find("predict: model.name=mlp; predict segments volumes with a "
                "unet3d, swin_unetr or dinov3 config"),
      std::string::npos);
  TrainConfig channels = volume_config(dir);
  channels.model.in_channels = 3;
  EXPECT_NE(
      error_of([&] {
        trained_on(channels, "predict");
      }).find("model.in_channels=3 but the volumes of data.train"),
      std::string::npos);
  TrainConfig window = volume_config(dir);
  window.validation.roi = {8, 8, 5};
  EXPECT_NE(
      error_of([&] {
        trained_on(window, "predict");
      }).find("must be multiples of 2 on every axis"),
      std::string::npos);
  TrainConfig classes = volume_config(dir);
  classes.model.num_classes = 1;
  EXPECT_NE(
      error_of([&] {
        trained_on(classes, "predict");
      }).find("set model.num_classes to at least 2"),
      std::string::npos);
}

TEST(InferenceModel, PredictsWithTheLoadedWeightsInEvalMode) {
  test::TempDir dir("infer-weights");
  TrainConfig cfg = volume_config(dir);
  const TrainedOn on = trained_on(cfg, "predict");
  // The weights: another seed's U-Net.
  ModelConfig other = cfg.model;
  other.seed = 7;
  const auto reference =
      make_model(other, volume_model_input(cfg, on.data, on.num_classes));
  reference->eval();
  save_safetensors(dir.file("w.safetensors"), state_tensors(*reference));

  // Keys a training run needs and predict does not.
  cfg.data.val = dir.file("missing.h5");
  cfg.validation.best_metric = "val_auc";
  cfg.data.read_threads = 4;
  InferenceModel model(cfg, on, test::cpu_placement());
  torch::manual_seed(3);
  const at::Tensor volume = torch::randn({1, 12, 16, 10});
  const at::Tensor before = model.predict_volume(volume, "v", 0);
  model.load_weights(dir.file("w.safetensors"), "--weights");
  const at::Tensor probs = model.predict_volume(volume, "v", 0);
  ASSERT_EQ(probs.sizes(), (std::vector<int64_t>{2, 12, 16, 10}));
  EXPECT_FALSE(probs.requires_grad());
  EXPECT_GT((probs - before).abs().max().item<float>(), 1e-4);

  int64_t sw_batch = cfg.validation.sw_batch, retries = 0;
  torch::NoGradGuard no_grad;
  const at::Tensor expected = volume_probs(
      volume,
      2,
      [&](const at::Tensor& w, const at::Tensor&, const at::Tensor&) {
        return reference->forward(w);
      },
      cfg.validation,
      validation_roi(cfg),
      ContextView{},
      &sw_batch,
      0,
      "v",
      &retries,
      test::cpu_placement());
  EXPECT_TRUE(torch::allclose(probs, expected, 1e-6, 1e-6));

  // A weights file that lacks a tensor is refused, naming it.
  NamedTensors partial = state_tensors(*reference);
  const std::string dropped = partial.back().first;
  partial.pop_back();
  save_safetensors(dir.file("partial.safetensors"), partial);
  EXPECT_NE(
      error_of([&] {
        model.load_weights(dir.file("partial.safetensors"), "--weights");
      }).find(dropped),
      std::string::npos);
}

}  // namespace
}  // namespace memtrain
