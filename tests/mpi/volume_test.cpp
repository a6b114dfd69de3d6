// Volumes and context features through the trainer, at every world size:
// a window's update does not depend on how its patches are split into
// micro-batches (the Dice + cross-entropy loss is a per-sample sum); the
// prefetcher does not change what is trained on; context features are
// fused and nothing of a micro-step outlives it.

#include <gtest/gtest.h>

#include <algorithm>

#include "mpi_support.h"

namespace memtrain {
namespace {

void make_volumes(const SharedDir& dir, const std::string& name) {
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 3;
  spec.channels = 2;
  spec.depth = 12;
  spec.height = 12;
  spec.width = 16;
  spec.classes = 3;
  spec.chunk = 4;
  spec.noise = 0.7;
  spec.seed = 9;
  make_shared_synthetic(dir, name, spec);
}

TrainConfig volume_config(const std::string& train) {
  TrainConfig c = base_config(train);
  c.model.name = ModelName::kUnet3d;
  c.model.feature_size = 4;
  c.model.depth = 2;
  c.model.norm = Norm::kInstance;
  c.data.patch_size = {8, 8, 8};
  c.data.patches_per_volume = 8;  // 24 patches: 3 windows of 8
  c.data.flip = Flip::kAll;
  c.training.effective_batch_size = 8;
  c.training.lr = 0.1;
  return c;
}

TEST(Volumes, WindowUpdateDoesNotDependOnTheSplit) {
  SharedDir dir("vol-split");
  make_volumes(dir, "train.h5");
  TrainConfig a = volume_config(dir.file("train.h5"));
  a.data.batch_size = 1;
  TrainConfig b = a;
  b.data.batch_size = 4;
  const RunResult ra = train(a, MPI_COMM_WORLD);
  const RunResult rb = train(b, MPI_COMM_WORLD);
  ASSERT_EQ(ra.summary.windows, 3);
  const double d = max_abs_diff(ra.params, rb.params);
  EXPECT_LT(d, 2e-6) << "micro-batch 1 vs 4";
  // The update was not zero: parameters moved from the initialisation.
  TrainConfig none = a;
  none.training.max_windows = 0;
  none.training.lr = 0.0;
  const RunResult r0 = train(none, MPI_COMM_WORLD);
  EXPECT_GT(max_abs_diff(ra.params, r0.params), 1e-3);
  for (size_t i = 0; i < ra.summary.window_results.size(); ++i) {
    EXPECT_NEAR(
        ra.summary.window_results[i].loss,
        rb.summary.window_results[i].loss,
        1e-5);
  }
}

TEST(Volumes, PrefetchingDoesNotChangeWhatIsTrained) {
  SharedDir dir("vol-prefetch");
  make_volumes(dir, "train.h5");
  TrainConfig a = volume_config(dir.file("train.h5"));
  a.data.batch_size = 2;
  a.data.prefetch = 0;
  TrainConfig b = a;
  b.data.prefetch = 3;
  b.data.read_threads = 3;
  const RunResult ra = train(a, MPI_COMM_WORLD);
  const RunResult rb = train(b, MPI_COMM_WORLD);
  EXPECT_EQ(max_abs_diff(ra.params, rb.params), 0.0);
  // Another data.seed draws other patches.
  TrainConfig c = a;
  c.data.seed = 1;
  const RunResult rc = train(c, MPI_COMM_WORLD);
  EXPECT_GT(max_abs_diff(ra.params, rc.params), 1e-4);
}

TEST(ContextFeatures, FusedAndReleasedAfterEveryMicroStep) {
  SharedDir dir("ctx");
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    SyntheticSpec spec;
    spec.samples = 256;
    spec.features = 12;
    spec.context = 20;
    spec.classes = 3;
    spec.noise = 2.0;  // local features alone are weak
    spec.seed = 5;
    make_synthetic(spec, dir.file("ctx.h5"));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TrainConfig c = base_config(dir.file("ctx.h5"));
  c.data.batch_size = 4;
  c.training.effective_batch_size = 32;
  c.training.lr = 0.05;
  c.training.epochs = 3;
  const RunResult r = train(c, MPI_COMM_WORLD);
  bool has_context = false;
  for (const auto& [name, p] : r.params) {
    if (name == "context.weight") {
      has_context = true;
      EXPECT_EQ(p.sizes(), (std::vector<int64_t>{16, 20}));
    }
  }
  EXPECT_TRUE(has_context);
  // Device bytes at the start of every micro-step of a window are the same:
  // nothing of step k (batch, context tensors, graph) survives into k+1.
  for (const auto& w : r.summary.window_results) {
    ASSERT_GE(w.micro_step_start_bytes.size(), 2u);
    for (int64_t b : w.micro_step_start_bytes)
      EXPECT_EQ(b, w.micro_step_start_bytes.front()) << "window " << w.step;
  }
  // ... and the level is the same in every window after the first (the
  // optimizer state exists from the first step on).
  const auto& ws = r.summary.window_results;
  for (size_t i = 2; i < ws.size(); ++i) {
    EXPECT_EQ(
        ws[i].micro_step_start_bytes.front(),
        ws[1].micro_step_start_bytes.front());
  }
  // It learns from the fused input.
  EXPECT_LT(ws.back().loss, 0.6 * ws.front().loss);
}

}  // namespace
}  // namespace memtrain
