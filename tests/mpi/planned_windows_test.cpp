// A planned window never runs out (Note [Planning]): for the U-Net,
// SE-ResNeXt50, SwinUNETR and CLIP tiny, batch and checkpointing auto, a
// run planned under a budget just above what a first plan predicted (no
// headroom) trains every window of an epoch -- full windows of 2 samples a
// rank and a last window of 1 sample -- without one OOM replay. The last
// window is the case that failed: on the CPU a 3x3x3 convolution of one
// sample takes LibTorch's im2col path, and a U-Net's window of 1 sample
// peaked at 71.3 MiB against 45.6 MiB for its micro-batch of 2, which was
// all the planner had probed.

#include <gtest/gtest.h>

#include <mpi.h>

#include <array>

#include "mpi_support.h"

namespace memtrain {
namespace {

struct Planned {
  MemoryPlan plan;
  TrainSummary summary;
};

Planned run_planned(const TrainConfig& c, bool train_it) {
  MpiCommunicator comm(MPI_COMM_WORLD);
  Trainer::Options opts;
  opts.write_outputs = false;
  Trainer t(c, comm, opts);
  t.prepare();
  Planned p;
  p.plan = t.memory_plan();
  if (train_it)
    p.summary = t.run();
  return p;
}

// `c` trains on 2 x world + 1 samples in windows of 2 x world: its peak
// predicted at micro-batch 2 without checkpointing (a first plan, under a
// budget it fits), then a plan with batch and checkpointing auto under 2%
// above that, with no headroom, and one epoch trained so.
void expect_windows_fit_just_above_the_plan(TrainConfig c) {
  const int w = world_size();
  c.data.val = "";
  c.training.effective_batch_size = 2 * w;
  c.training.epochs = 1;
  c.memory.headroom = 0;
  c.data.batch_size = 2;
  c.training.gradient_checkpointing = Checkpointing::kOff;
  c.memory.budget = "4GiB";
  const Planned first = run_planned(c, /*train_it=*/false);
  ASSERT_GT(first.plan.predicted_peak, 0);
  c.data.batch_size = kAuto;
  c.training.gradient_checkpointing = Checkpointing::kAuto;
  const int64_t tight =
      first.plan.predicted_peak + first.plan.predicted_peak / 50;
  c.memory.budget = std::to_string(tight);
  const Planned run = run_planned(c, /*train_it=*/true);
  EXPECT_LE(run.plan.predicted_peak, tight);
  // The window's micro-batches, the last window's 1 among them.
  ASSERT_FALSE(run.plan.window_micro_batches.empty());
  EXPECT_EQ(run.plan.window_micro_batches.back(), 1);
  ASSERT_EQ(run.summary.window_results.size(), 2u);
  for (const WindowResult& win : run.summary.window_results) {
    EXPECT_EQ(win.oom_retries_max, 0)
        << "window " << win.window << " of " << win.samples
        << " samples ran out on rank " << win.oom_retries_rank
        << " (plan: " << run.plan.note << ")";
    EXPECT_LE(win.mem_peak_reserved, tight);
  }
}

// A config of `model` on 2 x world + 1 volumes of D x H x W, one patch of
// that size each (a file in `dir`).
TrainConfig volume_config(
    const SharedDir& dir, ModelName model, std::array<int64_t, 3> dhw) {
  SyntheticSpec spec;
  spec.kind = "volumes";
  spec.samples = 2 * world_size() + 1;
  spec.channels = 1;
  spec.depth = dhw[0];
  spec.height = dhw[1];
  spec.width = dhw[2];
  spec.classes = 3;
  make_shared_synthetic(dir, "v.h5", spec);
  TrainConfig c = base_config(dir.file("v.h5"));
  c.model.name = model;
  c.data.patch_size = dhw;
  c.data.patches_per_volume = 1;
  c.training.lr = 0.01;
  return c;
}

TEST(PlannedWindows, UNetFitsJustAboveItsPlan) {
  SharedDir dir("pw_unet");
  expect_windows_fit_just_above_the_plan(
      volume_config(dir, ModelName::kUnet3d, {32, 32, 32}));
}

TEST(PlannedWindows, SeResNeXtFitsJustAboveItsPlan) {
  SharedDir dir("pw_se");
  SyntheticSpec spec;
  spec.kind = "images";
  spec.samples = 2 * world_size() + 1;
  spec.channels = 3;
  spec.height = spec.width = 64;  // layer4 at 2x2: batch-norm of 1 image
  spec.classes = 4;
  make_shared_synthetic(dir, "i.h5", spec);
  TrainConfig c = base_config(dir.file("i.h5"));
  c.model.name = ModelName::kSeresnext50;
  c.training.lr = 0.01;
  expect_windows_fit_just_above_the_plan(c);
}

// At one rank (tests/CMakeLists.txt, *_OneRank): 46 s alone there, 78 s
// at 4 ranks on 2 cores.
TEST(PlannedWindows, SwinUnetrFitsJustAboveItsPlan_OneRank) {
  SharedDir dir("pw_swin");
  // One axis of 64: instance norm at 1/32 of the patch has 2 voxels.
  TrainConfig c = volume_config(dir, ModelName::kSwinUnetr, {64, 32, 32});
  c.model.feature_size = 12;
  expect_windows_fit_just_above_the_plan(c);
}

TEST(PlannedWindows, ClipTinyFitsJustAboveItsPlan) {
  SharedDir dir("pw_clip");
  SyntheticSpec spec;
  spec.kind = "captions";
  spec.samples = 2 * world_size() + 1;
  spec.height = spec.width = 32;
  make_shared_synthetic(dir, "c.h5", spec);
  TrainConfig c = base_config(dir.file("c.h5"));
  c.model.name = ModelName::kClip;
  c.model.variant = "tiny";
  c.training.lr = 0.01;
  expect_windows_fit_just_above_the_plan(c);
}

}  // namespace
}  // namespace memtrain
