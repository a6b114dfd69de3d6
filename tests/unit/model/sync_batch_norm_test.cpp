// Synchronised batch-norm (model.sync_bn, model/blocks/sync_batch_norm.h) in
// one process: with the local hook it is LibTorch's training-mode batch-norm
// (output, gradients, running statistics); with a hook that adds another
// "rank"'s sums it is batch-norm on the two ranks' samples together
// (SyncBatchNorm's forward and backward), an empty micro-batch included;
// a ResNet with the local hook equals one without, checkpointed stages
// included, and calls the hook twice per batch-norm (once more per
// checkpointed one); models without batch-norm and the config refuse it;
// the agreed micro-step split.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <vector>

#include "memtrain/config/train_config.h"
#include "memtrain/data/sampling/sharded_sampler.h"
#include "memtrain/data/sampling/window_shape.h"
#include "memtrain/model/blocks/sync_batch_norm.h"
#include "memtrain/model/models.h"
#include "memtrain/model/registry.h"
#include "memtrain/util/error.h"
#include "memtrain/weights/model_state.h"

namespace memtrain {
namespace {

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

struct Params {
  torch::Tensor weight, bias;
};

Params make_params(int64_t c) {
  torch::manual_seed(7);
  return {
      (1.0 + 0.3 * torch::randn({c})).requires_grad_(),
      (0.2 * torch::randn({c})).requires_grad_()};
}

// The local hook equals torch::batch_norm in training mode: output, the
// gradients of input, weight and bias (a random upstream gradient), and the
// running statistics (momentum 0.1, unbiased variance, one more batch).
TEST(SyncBatchNorm, LocalHookEqualsLibTorchBatchNorm) {
  const int64_t C = 5;
  torch::manual_seed(3);
  const torch::Tensor x0 = 2.0 + 3.0 * torch::randn({6, C, 7, 4});
  const torch::Tensor g = torch::randn({6, C, 7, 4});
  const Params p = make_params(C);
  torch::Tensor rm_a = torch::randn({C}), rv_a = torch::rand({C}) + 0.5;
  torch::Tensor rm_b = rm_a.clone(), rv_b = rv_a.clone();
  torch::Tensor nbt = torch::zeros({}, torch::kLong);

  torch::Tensor xa = x0.clone().requires_grad_();
  const torch::Tensor ya = torch::batch_norm(
      xa, p.weight, p.bias, rm_a, rv_a, true, 0.1, 1e-5, false);
  (ya * g).sum().backward();
  const torch::Tensor ga_x = xa.grad().clone();
  const torch::Tensor ga_w = p.weight.grad().clone();
  const torch::Tensor ga_b = p.bias.grad().clone();
  p.weight.mutable_grad() = torch::Tensor();
  p.bias.mutable_grad() = torch::Tensor();

  int calls = 0;
  const BatchNormSync counting = [&calls](at::Tensor&) { ++calls; };
  torch::Tensor xb = x0.clone().requires_grad_();
  const torch::Tensor yb = sync_batch_norm(
      xb, p.weight, p.bias, rm_b, rv_b, nbt, true, 0.1, 1e-5, counting);
  EXPECT_EQ(calls, 1) << "one sum in forward";
  (yb * g).sum().backward();
  EXPECT_EQ(calls, 2) << "one sum in backward";

  const double dy = max_diff(ya, yb), dx = max_diff(ga_x, xb.grad()),
               dw = max_diff(ga_w, p.weight.grad()),
               db = max_diff(ga_b, p.bias.grad()), dm = max_diff(rm_a, rm_b),
               dv = max_diff(rv_a, rv_b);
  std::printf(
      "local hook vs torch::batch_norm: |dy| %.3g |dx| %.3g |dw| %.3g "
      "|db| %.3g |d running_mean| %.3g |d running_var| %.3g\n",
      dy,
      dx,
      dw,
      db,
      dm,
      dv);
  EXPECT_LE(dy, 1e-5);
  EXPECT_LE(dx, 1e-5);
  EXPECT_LE(dw, 1e-5 * std::max(1.0, ga_w.abs().max().item<double>()));
  EXPECT_LE(db, 1e-5 * std::max(1.0, ga_b.abs().max().item<double>()));
  EXPECT_LE(dm, 1e-6);
  EXPECT_LE(dv, 1e-5);
  EXPECT_EQ(nbt.item<int64_t>(), 1);

  // update=false (a checkpointed stage's recomputation): the same output,
  // running statistics untouched.
  const torch::Tensor rm_c = rm_b.clone(), rv_c = rv_b.clone();
  const torch::Tensor yc = sync_batch_norm(
      x0, p.weight, p.bias, rm_b, rv_b, nbt, false, 0.1, 1e-5, counting);
  EXPECT_LE(max_diff(yc, yb), 0.0);
  EXPECT_TRUE(torch::equal(rm_b, rm_c) && torch::equal(rv_b, rv_c));
  EXPECT_EQ(nbt.item<int64_t>(), 1);
}

// Two "ranks" in one process: rank A holds the first k samples, rank B the
// rest; A's hook adds B's sums (forward: count, sum, sum of squares;
// backward: sum of dy, sum of dy (x - mean) with the global mean). A's
// output and input gradient are the rows of batch-norm on all samples, and
// A's weight and bias gradients plus B's are its gradients. k = 0: A's
// micro-batch is empty and still takes part.
TEST(SyncBatchNorm, SumsOfAnotherRankGiveBatchNormOfTheUnion) {
  const int64_t C = 4;
  torch::manual_seed(9);
  const torch::Tensor x = 1.0 + 2.0 * torch::randn({7, C, 3, 5});
  const torch::Tensor g = torch::randn({7, C, 3, 5});
  const Params p = make_params(C);
  const std::vector<int64_t> dims{0, 2, 3};

  torch::Tensor xr = x.clone().requires_grad_();
  torch::Tensor rm_ref = torch::zeros({C}), rv_ref = torch::ones({C});
  const torch::Tensor yr = torch::batch_norm(
      xr, p.weight, p.bias, rm_ref, rv_ref, true, 0.1, 1e-5, false);
  (yr * g).sum().backward();
  const torch::Tensor gw_ref = p.weight.grad().clone();
  const torch::Tensor gb_ref = p.bias.grad().clone();
  const torch::Tensor mean = x.mean(dims);

  for (int64_t k : {3, 0}) {
    p.weight.mutable_grad() = torch::Tensor();
    p.bias.mutable_grad() = torch::Tensor();
    const torch::Tensor xa0 = x.narrow(0, 0, k);
    const torch::Tensor xb = x.narrow(0, k, 7 - k).to(torch::kDouble);
    const torch::Tensor gb = g.narrow(0, k, 7 - k).to(torch::kDouble);
    int call = 0;
    const BatchNormSync plus_b = [&](at::Tensor& t) {
      if (call++ == 0) {  // forward
        t[0] += static_cast<double>(xb.numel() / C);
        t.narrow(0, 1, C) += xb.sum(dims);
        t.narrow(0, 1 + C, C) += (xb * xb).sum(dims);
      } else {  // backward
        const torch::Tensor xmu =
            xb - mean.to(torch::kDouble).view({1, C, 1, 1});
        t.narrow(0, 0, C) += gb.sum(dims);
        t.narrow(0, C, C) += (gb * xmu).sum(dims);
      }
    };
    torch::Tensor rm = torch::zeros({C}), rv = torch::ones({C});
    torch::Tensor xa = xa0.clone().requires_grad_();
    const torch::Tensor ya = sync_batch_norm(
        xa, p.weight, p.bias, rm, rv, torch::Tensor(), true, 0.1, 1e-5, plus_b);
    (ya * g.narrow(0, 0, k)).sum().backward();
    EXPECT_EQ(call, 2) << "k=" << k;
    // B's own weight and bias gradients (its local sums).
    const torch::Tensor invstd =
        (x.var(dims, /*unbiased=*/false) + 1e-5).rsqrt();
    const torch::Tensor xmu_b = x.narrow(0, k, 7 - k) - mean.view({1, C, 1, 1});
    const torch::Tensor gw_b =
        (g.narrow(0, k, 7 - k) * xmu_b).sum(dims) * invstd;
    const torch::Tensor gb_b = g.narrow(0, k, 7 - k).sum(dims);
    const double dy = k ? max_diff(ya, yr.detach().narrow(0, 0, k)) : 0.0;
    const double dx = k ? max_diff(xa.grad(), xr.grad().narrow(0, 0, k)) : 0.0;
    const double dw = max_diff(p.weight.grad() + gw_b, gw_ref);
    const double db = max_diff(p.bias.grad() + gb_b, gb_ref);
    std::printf(
        "k=%lld of 7: |dy| %.3g |dx| %.3g |dw| %.3g |db| %.3g |d rm| %.3g "
        "|d rv| %.3g\n",
        static_cast<long long>(k),
        dy,
        dx,
        dw,
        db,
        max_diff(rm, rm_ref),
        max_diff(rv, rv_ref));
    EXPECT_EQ(ya.sizes(), xa0.sizes());
    EXPECT_LE(dy, 1e-5);
    EXPECT_LE(dx, 1e-5);
    EXPECT_LE(dw, 1e-4);
    EXPECT_LE(db, 1e-4);
    EXPECT_LE(max_diff(rm, rm_ref), 1e-6);
    EXPECT_LE(max_diff(rv, rv_ref), 1e-5);
    if (k == 0) {
      EXPECT_LE(p.weight.grad().abs().max().item<double>(), 0.0);
      EXPECT_LE(p.bias.grad().abs().max().item<double>(), 0.0);
    }
  }
}

TEST(SyncBatchNorm, OneValuePerChannelOverAllRanksIsRefused) {
  const Params p = make_params(2);
  torch::Tensor rm = torch::zeros({2}), rv = torch::ones({2});
  try {
    sync_batch_norm(
        torch::randn({1, 2, 1, 1}),
        p.weight,
        p.bias,
        rm,
        rv,
        torch::Tensor(),
        true,
        0.1,
        1e-5,
        local_batch_norm_sync());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("more than one value per channel"),
        std::string::npos)
        << e.what();
  }
}

std::shared_ptr<Classifier> resnet50(int64_t seed = 3) {
  ModelConfig cfg;
  cfg.name = ModelName::kResnet50;
  cfg.seed = seed;
  return make_model(cfg, {SampleKind::kImages, {3, 64, 64}, 3, 0});
}

// The parameters' gradients of one forward and backward (cross-entropy)
// of `net` in training mode on x, the logits, and the running statistics.
struct Step {
  std::vector<torch::Tensor> grads;
  torch::Tensor logits;
  std::vector<torch::Tensor> buffers;
};
Step step(Classifier& net, const torch::Tensor& x, const torch::Tensor& y) {
  net.train();
  Step s;
  s.logits = net.forward(x);
  torch::nn::functional::cross_entropy(s.logits, y).backward();
  for (const auto& p : net.parameters()) {
    s.grads.push_back(p.grad().clone());
    p.mutable_grad() = torch::Tensor();
  }
  for (const auto& b : net.buffers())
    s.buffers.push_back(b.clone());
  return s;
}

// Largest |a - b| over the tensors, each relative to max(1, max |a|).
double worst_relative(
    const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].scalar_type() == torch::kLong) {
      EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
      continue;
    }
    worst = std::max(
        worst,
        max_diff(a[i], b[i]) / std::max(1.0, a[i].abs().max().item<double>()));
  }
  return worst;
}

// A ResNet with the local hook (the planner's probes) trains as one
// without (timm's initialisation): gradients, logits and running
// statistics within 1e-5 (relative to max(1, max |t|)). (With random
// batch-norm weights a stack of 53 batch-norms on a micro-batch of 4 is
// chaotic in float32: a 1e-6 relative change of the input moves plain
// batch-norm's stem gradient by a few per cent, so no tolerance would
// separate the implementations there.) With layer1's and layer2's 7
// bottlenecks checkpointed the hook runs 53 x 2 + 23 times (resnet50's 53
// batch-norms in forward and backward, those 7 blocks' 23 again in the
// recomputation), and the running statistics still move once.
TEST(SyncBatchNorm, ResNetWithTheLocalHookEqualsPlainBatchNorm) {
  auto plain = resnet50();
  auto local = resnet50();  // model.seed: the same parameters
  int64_t calls = 0;
  local->set_batch_norm_sync([&calls](at::Tensor&) { ++calls; }, "resnet50");
  local->set_checkpointed(7);  // layer1.0 .. layer2.3
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({4, 3, 64, 64});
  const torch::Tensor y = torch::tensor({0, 1, 2, 1});
  const Step a = step(*plain, x, y);
  const Step b = step(*local, x, y);
  EXPECT_EQ(calls, 53 * 2 + 23);
  const double grads = worst_relative(a.grads, b.grads);
  const double logits = max_diff(a.logits, b.logits);
  const double buffers = worst_relative(a.buffers, b.buffers);
  std::printf(
      "local hook vs plain resnet50: gradients %.3g, logits %.3g, running "
      "statistics %.3g (relative to max(1, max |t|))\n",
      grads,
      logits,
      buffers);
  EXPECT_LE(grads, 1e-5);
  EXPECT_LE(logits, 1e-5);
  EXPECT_LE(buffers, 1e-5);
  const auto sb = local->named_buffers();
  EXPECT_EQ(sb["layer1.0.bn1.num_batches_tracked"].item<int64_t>(), 1);
  EXPECT_EQ(sb["bn1.num_batches_tracked"].item<int64_t>(), 1);
}

// An empty micro-batch (a rank with nothing in a short last window) runs
// the whole ResNet and its backward, calling the hook as often as a full
// one; here the hook adds a peer's full micro-batch's forward sums, so
// the statistics are defined.
TEST(SyncBatchNorm, EmptyMicroBatchTakesPartInEverySum) {
  auto net = resnet50();
  int64_t calls = 0;
  net->set_batch_norm_sync(
      [&calls](at::Tensor& t) {
        ++calls;
        if (t.numel() % 2 == 1) {  // forward: a peer with 2 values of 1, 3
          const int64_t C = (t.numel() - 1) / 2;
          t[0] += 2.0;
          t.narrow(0, 1, C) += 4.0;
          t.narrow(0, 1 + C, C) += 10.0;
        }
      },
      "resnet50");
  net->train();
  const torch::Tensor x = torch::zeros({0, 3, 32, 32});
  const torch::Tensor logits = net->forward(x);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{0, 3}));
  torch::nn::functional::cross_entropy(
      logits,
      torch::zeros({0}, torch::kLong),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
      .backward();
  EXPECT_EQ(calls, 53 * 2);
  for (const auto& p : net->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().max().item<double>(), 0.0);
  }
  // Statistics of the peer's values: mean 2, unbiased variance 2.
  const auto buffers = net->named_buffers();
  EXPECT_NEAR(buffers["bn1.running_mean"][0].item<double>(), 0.2, 1e-6);
  EXPECT_NEAR(buffers["bn1.running_var"][0].item<double>(), 0.9 + 0.2, 1e-6);
}

TEST(SyncBatchNorm, ModelsWithoutBatchNormAndConfigRefuse) {
  ModelConfig cfg;
  cfg.name = ModelName::kMlp;
  auto mlp = make_model(cfg, {SampleKind::kFeatures, {8}, 3, 0});
  try {
    mlp->set_batch_norm_sync(local_batch_norm_sync(), "mlp");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find(
            "model.sync_bn: true needs a model with batch-norm (resnet50, "
            "seresnext50_32x4d); model.name=mlp has none"),
        std::string::npos)
        << e.what();
  }
  mlp->set_batch_norm_sync(BatchNormSync(), "mlp");  // off: fine
  for (const char* name : {"mlp", "cnn", "unet3d", "dual_encoder"}) {
    try {
      check_model_config(TrainConfig::load(
          "", {std::string("model.name=") + name, "model.sync_bn=true"}));
      FAIL() << name;
    } catch (const Error& e) {
      EXPECT_NE(
          std::string(e.what()).find(
              std::string("model.sync_bn: true needs a model with batch-norm "
                          "(resnet50, seresnext50_32x4d); model.name=") +
              name + " has none"),
          std::string::npos)
          << e.what();
    }
  }
  EXPECT_TRUE(
      TrainConfig::load("", {"model.name=resnet50", "model.sync_bn=true"})
          .model.sync_bn);
  EXPECT_TRUE(TrainConfig::load(
                  "", {"model.name=seresnext50_32x4d", "model.sync_bn=true"})
                  .model.sync_bn);
  EXPECT_FALSE(TrainConfig::load("", {}).model.sync_bn);
  EXPECT_NE(
      TrainConfig::default_yaml().find("sync_bn: false"), std::string::npos);
}

TEST(SyncBatchNorm, AgreedMicroStepSplit) {
  // 10 samples over 4 ranks at micro-batch 2: shares 2, 3, 2, 3; every
  // rank runs ceil(3 / 2) = 2 micro-steps.
  EXPECT_EQ(micro_steps_for(10, 4, 2), 2);
  EXPECT_EQ(micro_steps_for(16, 2, 4), 2);
  EXPECT_EQ(micro_steps_for(1, 4, 2), 1);
  EXPECT_EQ(micro_steps_for(7, 2, 1), 4);
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(split_micro_batches_evenly({1, 2, 3}, 2), (V{{1, 2}, {3}}));
  EXPECT_EQ(split_micro_batches_evenly({1, 2}, 2), (V{{1}, {2}}));
  EXPECT_EQ(split_micro_batches_evenly({}, 2), (V{{}, {}}));
  EXPECT_EQ(split_micro_batches_evenly({5, 6, 7}, 4), (V{{5}, {6}, {7}, {}}));
  EXPECT_EQ(
      split_micro_batches_evenly({1, 2, 3, 4, 5, 6, 7, 8}, 2),
      split_micro_batches({1, 2, 3, 4, 5, 6, 7, 8}, 4));
}

}  // namespace
}  // namespace memtrain
