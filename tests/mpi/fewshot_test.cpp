// Few-shot episodes through the real window loop (Note [Episodes]): the
// update of a window of E = 8 episodes is one step on their mean query loss
// for every split into ranks x micro-steps x episodes per micro-step (each
// head: prototype, cosine, cosine_transformer), and
// validation over episodes is exact over ranks.

#include <gtest/gtest.h>

#include <mpi.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "memtrain/data/h5/h5_dataset.h"
#include "memtrain/data/sampling/episodes.h"
#include "memtrain/data/sampling/sharded_sampler.h"
#include "memtrain/model/blocks/fewshot_head.h"
#include "mpi_support.h"

namespace memtrain {
namespace {

void make_fewshot(const SharedDir& dir, const std::string& name) {
  SyntheticSpec spec;
  spec.kind = "fewshot";
  spec.classes = 16;
  spec.samples = 16 * 8;
  spec.features = 12;
  spec.seed = 3;
  make_shared_synthetic(dir, name, spec);
}

TrainConfig fewshot_config(const std::string& train, const std::string& head) {
  TrainConfig c = base_config(train);
  c.model.head = choice_of<Head>(head);
  c.model.embed_dim = 8;
  c.data.episodes = {3, 2, 3, 16};  // 3-way 2-shot, 3 queries, 16 per epoch
  c.data.val_classes.ids = {};
  c.data.val_classes.fraction = 0.25;
  c.data.seed = 11;
  c.validation.episodes = 0;
  c.training.lr = 0.5;
  // cosine_transformer: small, two repetitions (the loop over depth runs).
  c.model.fsct = {2, 4, 16, 2};
  return c;
}

// The first window's update written out with plain LibTorch: the 8
// episodes of window 0 (the epoch's permutation of episode ids), each
// read in one piece, their mean query cross-entropy, one SGD step.
NamedTensors reference_update(const TrainConfig& cfg) {
  const H5Dataset data = H5Dataset::open(cfg.data.train, "reference");
  const DatasetInfo& info = data.info();
  const EpisodeShape shape{
      cfg.data.episodes.n_way,
      cfg.data.episodes.k_shot,
      cfg.data.episodes.n_query};
  const ClassRows rows =
      ClassRows::from_labels(info.row_labels, info.num_classes, {});
  const ClassSplit split = split_classes(
      rows, {}, cfg.data.val_classes.fraction, cfg.data.seed, shape, true, "");
  const EpisodeSampler episodes(rows, split.train, shape, cfg.data.seed, 0);
  const ShardedSampler order(
      cfg.data.episodes.per_epoch, 8, 0, 1, cfg.data.seed, false);
  auto model = make_fewshot_model(
      cfg.model, {info.kind, info.sample_shape, info.num_classes}, shape);
  torch::Tensor total = torch::zeros({});
  for (int64_t id : order.window_indices(0, 0)) {
    const std::vector<int64_t> r = episodes.rows(0, id);
    auto x = torch::empty({shape.rows(), info.sample_numel()});
    auto y = torch::empty({shape.rows()}, torch::kInt64);
    data.read(r, x.data_ptr<float>(), y.data_ptr<int64_t>());
    auto labels = torch::arange(shape.n_way).repeat_interleave(shape.n_query);
    const auto logits = model->episode_logits(model->forward(x), shape);
    total =
        total + torch::nn::functional::cross_entropy(logits.squeeze(0), labels);
  }
  (total / 8.0).backward();
  return sgd_step(*model, cfg.training.lr);
}

class FewShotSplit : public ::testing::TestWithParam<std::string> {};

// 1 x 1 x 8 == W x K x 2 (2 x 2 x 2 at two ranks) == 1 x 8 x 1, and the
// hand-written step, within 1e-5 in fp32.
TEST_P(FewShotSplit, UpdateOfEightEpisodesIsIndependentOfTheSplit) {
  SharedDir dir("fewshot_split");
  make_fewshot(dir, "fs.h5");
  TrainConfig dist = fewshot_config(dir.file("fs.h5"), GetParam());
  dist.training.max_windows = 1;
  const SplitRuns s = train_splits(dist);
  ASSERT_EQ(s.dist.summary.windows, 1);
  EXPECT_EQ(s.dist.summary.window_results[0].samples, 8) << "8 episodes";
  expect_one_update(s, reference_update(s.whole));
}

INSTANTIATE_TEST_SUITE_P(
    Heads,
    FewShotSplit,
    ::testing::Values("prototype", "cosine", "cosine_transformer"));

// validation.episodes = 30 over 1, 2 or 4 ranks (uneven shares): the same
// mean accuracy and interval as one rank, each episode counted once.
TEST(FewShot, ValidationIsExactOverRanks) {
  SharedDir dir("fewshot_val");
  make_fewshot(dir, "fs.h5");
  TrainConfig c = fewshot_config(dir.file("fs.h5"), "cosine");
  c.validation.episodes = 30;
  c.data.batch_size = 2;
  c.data.episodes.per_epoch = 8;
  c.training.effective_batch_size = 8;
  c.data.val_batch_size = 4;
  const RunResult d = train(c, MPI_COMM_WORLD);
  const RunResult one = train(c, MPI_COMM_SELF);
  ASSERT_EQ(d.summary.validations.size(), 1u);
  ASSERT_EQ(one.summary.validations.size(), 1u);
  const ValResult& a = d.summary.validations[0];
  const ValResult& b = one.summary.validations[0];
  const auto episodes = [](const ValResult& v) {
    return nlohmann::json::parse(v.details).at("val_episodes").get<int64_t>();
  };
  EXPECT_EQ(episodes(a), 30);
  EXPECT_EQ(episodes(b), 30);
  // integer counts: exact
  EXPECT_EQ(a.metric("val_accuracy"), b.metric("val_accuracy"));
  EXPECT_EQ(a.metric("val_accuracy_ci95"), b.metric("val_accuracy_ci95"));
  EXPECT_NEAR(a.loss, b.loss, 1e-6);
  EXPECT_GT(a.metric("val_accuracy_ci95"), 0.0);
  EXPECT_GE(a.metric("val_accuracy"), 0.0);
  EXPECT_LE(a.metric("val_accuracy"), 1.0);
}

}  // namespace
}  // namespace memtrain
