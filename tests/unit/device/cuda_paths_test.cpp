// The CUDA-only branches, each in seconds on one GPU (tests/gpu/run.sh runs
// them in its first call): scaled_dot_product_attention against the math
// (Swin's masked windows, CLIP's causal text), the host-offload mover
// (pinned pool, copy stream) against full checkpointing, bf16 autocast
// through the U-Net, SwinUNETR and CLIP, channels-last convolutions, the
// loss scaler's skip on an injected inf, and the loop's two host reads per
// window with SwinUNETR. The optimizers' fused and foreach kernels and the
// clipping on the device are in optimizers_test.cpp. Deterministic
// (compat::set_deterministic: no TF32, no cuDNN benchmark), so that
// tolerances are float32's.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "memtrain/compat.h"
#include "memtrain/data/synthetic/synthetic.h"
#include "memtrain/device/placement.h"
#include "memtrain/dist/mpi_communicator.h"
#include "memtrain/memory/host_pool.h"
#include "memtrain/model/nets/clip.h"
#include "memtrain/model/nets/swin_unetr.h"
#include "memtrain/model/registry.h"
#include "memtrain/train/loop/trainer.h"
#include "memtrain/train/state/loss_scaler.h"
#include "test_support.h"
#include "tier_steps.h"

namespace memtrain {
namespace {

using tier_test::Step;
using tier_test::Tier;

const torch::Device kCuda(torch::kCUDA, 0);

double max_abs(const torch::Tensor& t) {
  return t.abs().max().item<double>();
}

// compat::attention (scaled_dot_product_attention on LibTorch 2.x) against
// the written-out math on the GPU, forward and backward: Swin's shifted
// windows (a bias per window and head holding its -100 mask: 8 windows of
// 7^3 tokens, 3 heads) and CLIP's causal text tower (77 tokens, no bias).
TEST(CudaPaths, AttentionAgreesWithTheMath_CUDA) {
  compat::set_deterministic(true);
  torch::manual_seed(0);
  auto make = [](std::vector<int64_t> s) {
    return torch::randn(s).to(kCuda).requires_grad_();
  };
  const int64_t n = 343;
  const torch::Tensor mask =
      detail::swin_shift_mask({14, 14, 14}, {7, 7, 7}, {3, 3, 3}, kCuda);
  ASSERT_EQ(mask.size(0), 8);
  for (const bool swin : {true, false}) {
    const int64_t len = swin ? n : 77, heads = swin ? 8 * 3 : 8,
                  e = swin ? 16 : 64;
    const torch::Tensor q = make({2, heads, len, e}),
                        k = make({2, heads, len, e}),
                        v = make({2, heads, len, e});
    torch::Tensor bias;
    if (swin) {
      bias = (torch::randn({1, 3, n, n}).to(kCuda) + mask.unsqueeze(1))
                 .reshape({8 * 3, n, n})
                 .detach()
                 .requires_grad_();
    }
    const double scale = 1.0 / std::sqrt(static_cast<double>(e));
    const torch::Tensor a = compat::attention(q, k, v, bias, scale, !swin);
    const torch::Tensor m = compat::attention_math(q, k, v, bias, scale, !swin);
    const torch::Tensor g = torch::randn_like(a);
    std::vector<torch::Tensor> in = {q, k, v};
    if (swin)
      in.push_back(bias);
    const auto ga = torch::autograd::grad({a}, in, {g});
    const auto gm = torch::autograd::grad({m}, in, {g});
    EXPECT_LE(max_abs(a - m), 1e-4 * max_abs(m)) << (swin ? "swin" : "clip");
    for (size_t i = 0; i < in.size(); ++i)
      EXPECT_LE(max_abs(ga[i] - gm[i]), 1e-4 * max_abs(gm[i]) + 1e-7)
          << (swin ? "swin" : "clip") << " input " << i;
  }
}

// The CUDA host-offload mover: a checkpoint's inputs go to the pinned pool
// on its copy stream and come back one segment ahead; the U-Net's
// gradients equal those of full checkpointing bit for bit, and every block
// is free again afterwards.
TEST(CudaPaths, HostOffloadIsFullCheckpointing_CUDA) {
  compat::set_deterministic(true);
  const auto pool = std::make_shared<memory::HostPool>(0);
  memory::set_offload_pool(pool);
  const tier_test::VolumeBatch batch(1, {2, 32, 32, 32});
  const torch::Tensor x = batch.x.to(kCuda), target = batch.target.to(kCuda);
  const auto loss = [&](const torch::Tensor& y) {
    return dice_ce_loss_sum(y, target);
  };
  for (const bool lean : {false, true}) {
    const auto net = tier_test::unet(Norm::kInstance, lean);
    net->to(kCuda);
    const Step all = tier_test::step(*net, Tier::kAll, x, loss);
    const Step off = tier_test::step(*net, Tier::kOffload, x, loss);
    tier_test::expect_bitwise(all, off, lean ? "lean" : "concatenated");
    EXPECT_GT(off.copied_in, 0) << "the inputs came back through copies";
    EXPECT_EQ(pool->stats().in_use, 0) << "every block is free again";
  }
  memory::set_offload_pool(nullptr);
}

// bf16 autocast on the GPU (CUDA's autocast lists): the U-Net's and
// SwinUNETR's logits near fp32's, checkpointed or not, every gradient
// finite; CLIP's unit embeddings near fp32's.
TEST(CudaPaths, Bf16AutocastThroughUNetSwinAndClip_CUDA) {
  compat::set_deterministic(true);
  {
    const tier_test::VolumeBatch batch(2, {1, 64, 32, 32});
    const torch::Tensor x = batch.x.to(kCuda), target = batch.target.to(kCuda);
    const auto loss = [&](const torch::Tensor& y) {
      return dice_ce_loss_sum(y, target);
    };
    ModelConfig cfg;
    cfg.name = ModelName::kSwinUnetr;
    cfg.feature_size = 12;
    cfg.seed = 3;
    torch::manual_seed(3);
    const std::vector<std::pair<const char*, std::shared_ptr<Classifier>>>
        nets = {
            {"unet3d", tier_test::unet(Norm::kInstance, true)},
            {"swin_unetr", make_swin_unetr(cfg, 1, 3)}};
    for (const auto& [name, net] : nets) {
      net->to(kCuda);
      const Step fp32 = tier_test::step(*net, Tier::kOff, x, loss);
      for (const Tier t : {Tier::kOff, Tier::kAll}) {
        const Step s = tier_test::step(*net, t, x, loss, /*bf16=*/true);
        EXPECT_EQ(s.out.scalar_type(), torch::kBFloat16) << name;
        EXPECT_LE(
            max_abs(s.out.to(torch::kFloat32) - fp32.out),
            0.05 * max_abs(fp32.out))
            << name;
        for (const auto& [p, g] : s.grads)
          EXPECT_TRUE(torch::isfinite(g).all().item<bool>()) << name << p;
      }
    }
  }
  ModelConfig cfg;
  cfg.name = ModelName::kClip;
  cfg.variant = "tiny";
  cfg.seed = 5;
  ModelInput in;
  in.kind = SampleKind::kImages;
  in.sample_shape = {3, 32, 32};
  in.context_features = 12;
  in.tokens = true;
  in.token_max = 49407;
  const auto clip = make_clip(cfg, in);
  clip->to(kCuda);
  torch::manual_seed(6);
  const torch::Tensor images = torch::randn({3, 3, 32, 32}).to(kCuda);
  torch::Tensor tokens = torch::zeros({3, 12});
  for (int64_t i = 0; i < 3; ++i) {
    tokens[i][0] = 49406;
    tokens[i].narrow(0, 1, 2 + i).copy_(torch::randint(1, 49406, {2 + i}));
    tokens[i][3 + i] = 49407;
  }
  tokens = tokens.to(kCuda);
  const torch::Tensor fp32 = clip->forward(images, tokens).detach();
  torch::Tensor bf16;
  {
    compat::AutocastGuard amp(true, /*cuda=*/true, torch::kBFloat16);
    bf16 = clip->forward(images, tokens);
  }
  (bf16.to(torch::kFloat32).select(1, 0) *
   bf16.to(torch::kFloat32).select(1, 1))
      .sum()
      .backward();
  EXPECT_LE(max_abs(bf16.to(torch::kFloat32) - fp32), 0.05);
  for (const auto& p : clip->parameters()) {
    if (p.grad().defined())
      EXPECT_TRUE(torch::isfinite(p.grad()).all().item<bool>());
  }
}

// model.channels_last on the GPU: SE-ResNeXt50 with NHWC weights and
// input (cuDNN's other kernels) gives the logits and gradients of the
// contiguous model to float32 rounding.
TEST(CudaPaths, ChannelsLastChangesOnlyTheRounding_CUDA) {
  compat::set_deterministic(true);
  ModelConfig cfg;
  cfg.name = ModelName::kSeresnext50;
  cfg.seed = 3;
  const ModelInput images{SampleKind::kImages, {3, 64, 64}, 10, 0};
  const auto plain = make_model(cfg, images), nhwc = make_model(cfg, images);
  plain->to(kCuda);
  nhwc->to(kCuda);
  nhwc->to_channels_last();
  torch::manual_seed(4);
  const torch::Tensor x = torch::randn({4, 3, 64, 64}).to(kCuda);
  const torch::Tensor a = plain->forward(x);
  const torch::Tensor b =
      nhwc->forward(x.contiguous(at::MemoryFormat::ChannelsLast));
  EXPECT_LE(max_abs(a - b), 1e-4 * max_abs(a));
  a.pow(2).sum().backward();
  b.pow(2).sum().backward();
  const auto pa = plain->named_parameters(), pb = nhwc->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const torch::Tensor ga = pa[i].value().grad(), gb = pb[i].value().grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << pa[i].key();
    EXPECT_LE(max_abs(ga - gb), 1e-3 * max_abs(ga) + 1e-6) << pa[i].key();
    if (gb.dim() == 4)
      EXPECT_TRUE(gb.is_contiguous(at::MemoryFormat::ChannelsLast))
          << pb[i].key();
  }
}

// The fp16 loss scaler on the GPU: unscale() flags an injected inf or NaN
// on the device (GradScaler's fused kernel), the step is skipped and the
// scale halves; finite steps in a row grow it again.
TEST(CudaPaths, LossScalerSkipsAnInjectedInf_CUDA) {
  LossScaler s(true, 1024.0, /*growth_interval=*/2);
  torch::Tensor p = torch::zeros(
      {3}, torch::TensorOptions().device(kCuda).requires_grad(true));
  auto unscale_and_check = [&](const std::vector<float>& g) {
    p.mutable_grad() = torch::tensor(g).to(kCuda);
    const at::Tensor found = torch::zeros({1}).to(kCuda);
    s.unscale({p}, found);
    return found.item<float>() == 0.0f;
  };
  EXPECT_TRUE(unscale_and_check({2048.0f, -512.0f, 0.0f}));
  EXPECT_TRUE(torch::equal(p.grad().cpu(), torch::tensor({2.0f, -0.5f, 0.0f})));
  s.update(true);
  EXPECT_FALSE(unscale_and_check({1.0f, INFINITY, 0.0f}));
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  EXPECT_EQ(s.skipped_steps(), 1);
  EXPECT_FALSE(unscale_and_check({NAN, 1.0f, 0.0f}));
  s.update(false);
  EXPECT_EQ(s.scale(), 256.0);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(unscale_and_check({1.0f, 1.0f, 1.0f}));
    s.update(true);
  }
  EXPECT_EQ(s.scale(), 512.0);
}

// Note [One host read per window] on the GPU with SwinUNETR (whose
// shifted-window mask once came from the host in every forward): two host
// syncs per window whatever the accumulation, through the trainer with the
// CUDA placement. In a process of its own, which chooses its device as
// memtrain does (test::run_in_own_process), with MPI for a world of one.

TEST(CudaPaths, SwinUnetrReadsTheHostTwicePerWindow_CUDA) {
  if (std::getenv("MEMTRAIN_TEST_OWN_PROCESS") == nullptr) {
    EXPECT_EQ(
        test::run_in_own_process(
            "CudaPaths.SwinUnetrReadsTheHostTwicePerWindow_CUDA"),
        0);
    return;
  }
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited)
    MPI_Init(nullptr, nullptr);
  {
    const auto placement = Placement::choose(DeviceChoice::kCuda, 0, "");
    test::TempDir dir("swin-syncs");
    SyntheticSpec spec;
    spec.kind = "volumes";
    spec.samples = 2;
    spec.channels = 1;
    spec.depth = 64;
    spec.height = spec.width = 32;
    spec.classes = 3;
    spec.seed = 9;
    make_synthetic(spec, dir.file("train.h5"));
    TrainConfig c;
    c.data.train = dir.file("train.h5");
    c.data.val = "";
    c.data.patch_size = {64, 32, 32};
    c.data.patches_per_volume = 2;
    c.data.batch_size = 1;
    c.model.name = ModelName::kSwinUnetr;
    c.model.feature_size = 12;
    c.training.lr = 1e-3;
    c.training.epochs = 100;
    c.training.max_windows = 3;
    c.output.dir = "";
    for (const int64_t k : {1, 2}) {
      c.training.gradient_accumulation_steps = k;
      MpiCommunicator comm(MPI_COMM_SELF);
      Trainer::Options opts;
      opts.write_outputs = false;
      opts.placement = placement.get();
      Trainer t(c, comm, opts);
      const TrainSummary s = t.run();
      ASSERT_EQ(s.window_results.size(), 3u);
      for (const auto& w : s.window_results) {
        EXPECT_EQ(w.micro_steps, k);
        EXPECT_EQ(w.host_syncs, 2) << "accumulation " << k;
      }
    }
  }
  MPI_Finalize();
}

}  // namespace
}  // namespace memtrain
