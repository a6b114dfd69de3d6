// Host offload through the trainer, at every world size (Note [Host
// offload]): training.gradient_checkpointing=offload trains exactly as
// full checkpointing, with its host pool reserved once and reused by every
// window; an out-of-memory replay and a resume work with offload on.

#include <gtest/gtest.h>

#include <mpi.h>

#include <algorithm>

#include "mpi_support.h"

namespace memtrain {
namespace {

// A small U-Net on 16^3 volumes, 2 patches per micro-batch on each rank.
TrainConfig unet_config(const SharedDir& dir) {
  TrainConfig c = base_config(dir.file("train.h5"));
  c.model.name = ModelName::kUnet3d;
  c.model.feature_size = 8;
  c.model.depth = 2;
  c.model.norm = Norm::kInstance;
  c.data.patch_size = {16, 16, 16};
  c.data.patches_per_volume = 2;
  c.data.batch_size = 2;
  c.training.effective_batch_size = 2 * world_size();
  c.training.lr = 0.01;
  c.training.momentum = 0.9;
  c.training.epochs = 1000;
  c.dist.check_replicas = CheckReplicas::kEpoch;
  return c;
}

void make_volumes(const SharedDir& dir) {
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 4;
  spec.channels = 1;
  spec.depth = spec.height = spec.width = 16;
  spec.classes = 3;
  spec.seed = 9;
  make_shared_synthetic(dir, "train.h5", spec);
}

// Issue check: gradients (here 20 windows of updates) bitwise those of full
// checkpointing, and the host pool reserved in the first window and never
// grown after (20 windows).
TEST(HostOffloadRun, TrainsAsFullCheckpointingAndReusesItsPool) {
  SharedDir dir("offload");
  make_volumes(dir);
  TrainConfig all = unet_config(dir);
  all.training.gradient_checkpointing = Checkpointing::kAll;
  all.training.max_windows = 20;
  TrainConfig offload = all;
  offload.training.gradient_checkpointing = Checkpointing::kOffload;
  const RunResult a = train(all, MPI_COMM_WORLD);
  const RunResult o = train(offload, MPI_COMM_WORLD);
  EXPECT_EQ(max_abs_diff(a.params, o.params), 0.0);
  const auto& wins = o.summary.window_results;
  ASSERT_EQ(wins.size(), 20u);
  const int64_t reserved = wins.front().host_reserved;
  EXPECT_GT(reserved, 0);
  for (const auto& w : wins) {
    EXPECT_EQ(w.host_reserved, reserved) << "window " << w.step;
    EXPECT_GT(w.host_peak, 0) << "window " << w.step;
    EXPECT_LE(w.host_peak, reserved);
  }
  for (const auto& w : a.summary.window_results)
    EXPECT_EQ(w.host_reserved, 0) << "no pool without offload";
  // The device held less than full checkpointing's.
  EXPECT_LT(
      max_over_windows(o, &WindowResult::mem_peak),
      max_over_windows(a, &WindowResult::mem_peak));
}

// An out-of-memory error with offload on: the graph and its offloaded
// inputs are freed as it unwinds, the window replays at half the
// micro-batch, and the update is that micro-batch's.
TEST(HostOffloadRun, OomReplaysWithOffload) {
  SharedDir dir("offload-oom");
  make_volumes(dir);
  TrainConfig big = unet_config(dir);
  big.training.gradient_checkpointing = Checkpointing::kOffload;
  big.data.patches_per_volume = 4;
  big.data.batch_size = 4;
  big.training.effective_batch_size = 4 * world_size();
  big.training.max_windows = 3;
  big.memory.budget = "1GiB";  // the lean forms a budget runs
  TrainConfig small = big;
  small.data.batch_size = 2;
  const RunResult big_free = train(big, MPI_COMM_WORLD);
  const RunResult small_run = train(small, MPI_COMM_WORLD);
  const int64_t p4 = max_over_windows(big_free, &WindowResult::mem_peak);
  const int64_t p2 = max_over_windows(small_run, &WindowResult::mem_peak);
  ASSERT_LT(p2, p4);
  big.memory.budget = std::to_string((p2 + p4) / 2);
  big.memory.headroom = 0.0;
  const RunResult recovered = train(big, MPI_COMM_WORLD);
  EXPECT_GT(recovered.summary.oom_retries, 0);
  EXPECT_EQ(recovered.summary.window_results.back().micro_batch, 2);
  EXPECT_LT(max_abs_diff(recovered.params, small_run.params), 1e-5);
  // The pool did not grow after the replay's first window.
  const auto& wins = recovered.summary.window_results;
  for (const auto& w : wins)
    EXPECT_EQ(w.host_reserved, wins.front().host_reserved);
}

// A run with offload stopped mid-way and resumed repeats the
// uninterrupted one bit for bit.
TEST(HostOffloadRun, ResumeWithOffloadRepeatsTheUninterruptedRun) {
  SharedDir dir("offload-resume");
  make_volumes(dir);
  TrainConfig full = unet_config(dir);
  full.training.gradient_checkpointing = Checkpointing::kOffload;
  full.training.epochs = 2;
  full.training.checkpoint_every = 1;
  full.output.dir = dir.file("full");
  const RunResult whole = train_out(full, MPI_COMM_WORLD).run;
  ASSERT_GE(whole.summary.windows, 2);
  TrainConfig part = full;
  part.output.dir = dir.file("part");
  part.training.max_windows = whole.summary.windows / 2;
  const RunResult first = train_out(part, MPI_COMM_WORLD).run;
  part.training.max_windows = 0;
  const Resumed second = train_out(part, MPI_COMM_WORLD, "auto");
  EXPECT_NE(second.note.find("resumed from"), std::string::npos) << second.note;
  std::vector<double> joined = losses(first);
  const std::vector<double> rest = losses(second.run);
  joined.insert(joined.end(), rest.begin(), rest.end());
  EXPECT_EQ(joined, losses(whole));
  EXPECT_EQ(max_abs_diff(second.run.params, whole.params), 0.0);
}

// Note [Host plan]: a run whose holders of host memory pass
// memory.host_budget is refused at start on every rank, with each holder's
// arithmetic, before a window runs; with room for them it trains.
TEST(HostPlan, ARunOverItsHostBudgetIsRefusedAtStartOnEveryRank) {
  SharedDir dir("hostplan");
  make_volumes(dir);
  TrainConfig c = unet_config(dir);
  c.data.val = dir.file("train.h5");
  c.training.gradient_checkpointing = Checkpointing::kOffload;
  c.training.max_windows = 1;
  c.memory.host_budget = "64MiB";  // the libraries alone hold more
  std::string what;
  try {
    train(c, MPI_COMM_WORLD);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(
      what.find("of host memory, more than its host budget of 64.0 MiB "
                "(memory.host_budget=64MiB)"),
      std::string::npos)
      << what;
  for (const char* holder :
       {"\n  outside ",
        "\n  CPU device ",
        "\n  prefetch ",
        "\n  validation ",
        "\n  HDF5 chunk caches "}) {
    EXPECT_NE(what.find(holder), std::string::npos) << holder << what;
  }
  EXPECT_NE(what.find("give the job more memory"), std::string::npos) << what;
  c.memory.host_budget = "auto";
  EXPECT_NO_THROW(train(c, MPI_COMM_WORLD));
}

}  // namespace
}  // namespace memtrain
