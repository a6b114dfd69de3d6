// The regression task (Note [Tasks]; docs/data-format.md, "Targets") under 1, 2
// and 4 ranks: a window's update is the hand-written MSE step whatever the
// split, and validation's MAE and RMSE are the ones recomputed here from
// the trained parameters, the same at every world size.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/sharded_sampler.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "mpi_support.h"

namespace memtrain {
namespace {

void make_regression(
    const SharedDir& dir,
    const std::string& name,
    const std::string& split,
    int64_t samples) {
  SyntheticSpec spec;
  spec.kind = "regression";
  spec.samples = samples;
  spec.features = 6;
  spec.targets = 2;
  spec.noise = 0.1;
  spec.seed = 4;
  spec.split = split;
  make_shared_synthetic(dir, name, spec);
}

// All rows of `data`: features and targets.
std::pair<at::Tensor, at::Tensor> read_all(const H5Dataset& data) {
  const DatasetInfo& info = data.info();
  std::vector<int64_t> rows(info.num_samples);
  for (int64_t i = 0; i < info.num_samples; ++i)
    rows[i] = i;
  at::Tensor x = torch::empty({info.num_samples, info.sample_numel()});
  at::Tensor t = torch::empty({info.num_samples, info.targets});
  data.read(rows, x.data_ptr<float>(), nullptr, nullptr, t.data_ptr<float>());
  return {x, t};
}

// A model of `cfg` holding `params`.
std::shared_ptr<Classifier> model_with(
    const TrainConfig& cfg,
    const DatasetInfo& info,
    const NamedTensors& params) {
  auto model =
      make_model(cfg.model, {info.kind, info.sample_shape, info.targets});
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (const auto& item : model->named_parameters()) {
    EXPECT_EQ(item.key(), params.at(i).first);
    item.value().copy_(params.at(i++).second);
  }
  return model;
}

// The first window's update with plain LibTorch: its 8 rows (the epoch's
// permutation), the mean over rows of each row's mean squared error over
// its targets, one SGD step from the same initial parameters.
NamedTensors reference_update(const TrainConfig& cfg) {
  const H5Dataset data = H5Dataset::open(cfg.data.train, "reference");
  const DatasetInfo& info = data.info();
  const ShardedSampler order(info.num_samples, 8, 0, 1, cfg.data.seed, false);
  const std::vector<int64_t> ids = order.window_indices(0, 0);
  at::Tensor x = torch::empty({8, info.sample_numel()});
  at::Tensor t = torch::empty({8, info.targets});
  data.read(ids, x.data_ptr<float>(), nullptr, nullptr, t.data_ptr<float>());
  auto model =
      make_model(cfg.model, {info.kind, info.sample_shape, info.targets});
  torch::mse_loss(model->forward(x), t).backward();  // mean over 8 x 2
  return sgd_step(*model, cfg.training.lr);
}

TrainConfig regression_config(const std::string& train) {
  TrainConfig c = base_config(train);
  c.training.lr = 0.2;
  return c;
}

// 1 x 1 x 8 == W x K x 2 == 1 x 8 x 1 == the hand-written step, within
// 1e-5 in fp32.
TEST(Regression, UpdateIsTheMseStepWhateverTheSplit) {
  SharedDir dir("regression_split");
  make_regression(dir, "train.h5", "train", 32);
  const SplitRuns s = train_splits(regression_config(dir.file("train.h5")));
  ASSERT_EQ(s.dist.summary.windows, 1);
  EXPECT_EQ(s.dist.summary.window_results[0].samples, 8);
  expect_one_update(s, reference_update(s.whole));
}

// Two epochs with validation on 30 rows (uneven shares at 4 ranks): MAE
// and RMSE over every target equal their recomputation from the trained
// parameters, val_loss is RMSE squared, the world's equal a single rank's,
// and the model learnt (RMSE well below the targets' spread).
TEST(Regression, ValidationReportsMaeAndRmseExactly) {
  SharedDir dir("regression_val");
  make_regression(dir, "train.h5", "train", 64);
  make_regression(dir, "val.h5", "val", 30);
  TrainConfig c = regression_config(dir.file("train.h5"));
  c.data.val = dir.file("val.h5");
  c.training.epochs = 2;
  c.training.effective_batch_size = 8;
  c.data.batch_size = 4;
  c.data.val_batch_size = 4;
  c.training.optimizer = Optimizer::kAdamw;
  c.training.lr = 0.02;
  const RunResult world = train(c, MPI_COMM_WORLD);
  const RunResult self = train(c, MPI_COMM_SELF);
  ASSERT_EQ(world.summary.validations.size(), 2u);
  ASSERT_EQ(self.summary.validations.size(), 2u);
  const ValResult& v = world.summary.validations[1];
  EXPECT_EQ(v.samples, 30);
  ASSERT_EQ(v.metrics.size(), 2u);
  EXPECT_EQ(v.metrics[0].key, "val_mae");
  EXPECT_EQ(v.metrics[1].key, "val_rmse");
  EXPECT_EQ(v.metrics[0].better, Better::kLower);
  EXPECT_NEAR(v.loss, std::pow(v.metric("val_rmse"), 2), 1e-12);

  const H5Dataset val = H5Dataset::open(c.data.val, "reference");
  const auto [x, t] = read_all(val);
  auto model = model_with(c, val.info(), world.params);
  torch::NoGradGuard no_grad;
  const at::Tensor e = (model->forward(x) - t).to(torch::kFloat64);
  const double mae = e.abs().mean().item<double>();
  const double rmse = std::sqrt(e.pow(2).mean().item<double>());
  EXPECT_NEAR(v.metric("val_mae"), mae, 1e-5 * mae);
  EXPECT_NEAR(v.metric("val_rmse"), rmse, 1e-5 * rmse);
  const ValResult& s = self.summary.validations[1];
  EXPECT_NEAR(s.metric("val_mae"), v.metric("val_mae"), 1e-5 * mae);
  EXPECT_NEAR(s.metric("val_rmse"), v.metric("val_rmse"), 1e-5 * rmse);
  const double spread = t.to(torch::kFloat64).std().item<double>();
  EXPECT_LT(rmse, 0.7 * spread) << "two epochs of a linear map should learn";
  EXPECT_LT(
      v.metric("val_rmse"), world.summary.validations[0].metric("val_rmse"));
}

}  // namespace
}  // namespace memtrain
